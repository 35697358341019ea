"""bench/common.py's engine start-up: a fleet's KV-event ports cannot be taken by another port pick
before the engines bind them, and an engine that loses a port anyway is started again, alone, with
fresh ports. Real motor-sim processes; no benchmark figures."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest

from bench.common import (
    ZERO,
    kv_event_ports,
    start_engines,
    start_until_bound,
)
from motor_common.ports import ephemeral_range, port_free
from tests.procs import Proc, start_simulator


def _outside_ephemeral(port: int) -> bool:
    low, high = ephemeral_range()
    return not low <= port <= high


def test_a_fleets_kv_event_ports_are_free_distinct_and_outside_the_ephemeral_range() -> None:
    taken: set[int] = set()
    ports = [p for _ in range(16) for p in kv_event_ports(taken).values()]
    assert len(set(ports)) == len(ports) == 32 and set(ports) == taken
    assert all(_outside_ephemeral(p) for p in ports)  # no free_port() pick can land on one
    assert all(port_free("0.0.0.0", p) for p in ports)


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another process holds (listening on every address, as a KV-event publisher binds)."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        yield int(s.getsockname()[1])


def _sim(tmp_path: Path, name: str, kv_port: int) -> AbstractAsyncContextManager[Proc]:
    cfg = {"publisher": "zmq", "endpoint": f"tcp://*:{kv_port}", "topic": "kv-events", "enable_kv_cache_events": True}
    return start_simulator("vllm", "prefill", tmp_path, name=name, extra_args=[*ZERO, "--kv-events-config", json.dumps(cfg)])


async def test_an_engine_that_lost_a_port_is_started_again_with_fresh_ports(tmp_path: Path, held_port: int) -> None:
    given: list[int] = []

    def start() -> AbstractAsyncContextManager[Proc]:  # the first attempt gets the held port
        given.append(held_port if not given else kv_event_ports(set())["kv_events_port"])
        return _sim(tmp_path, f"sim-{len(given)}", given[-1])

    async with AsyncExitStack() as es:
        proc = await start_until_bound(es, "sim", start)
        assert len(given) == 2 and given[1] != held_port
        assert proc.alive() and re.search(rf"KV events published on tcp://[^ ]+:{given[1]} ", proc.log())
    assert "Address already in use" in (tmp_path / "sim-1.log").read_text()


async def test_a_port_lost_on_every_attempt_ends_in_an_error_that_says_so(tmp_path: Path, held_port: int) -> None:
    calls: list[int] = []

    def start() -> AbstractAsyncContextManager[Proc]:
        calls.append(1)
        return _sim(tmp_path, f"sim-{len(calls)}", held_port)

    async with AsyncExitStack() as es:
        with pytest.raises(RuntimeError, match=r"sim: a port it was given was taken before it could bind it, "
                                               r"2 times with fresh ports"):
            await start_until_bound(es, "sim", start, attempts=2)
    assert len(calls) == 2


async def test_a_start_up_that_fails_for_another_reason_is_not_retried(tmp_path: Path) -> None:
    calls: list[int] = []

    @asynccontextmanager
    async def start() -> AsyncIterator[Proc]:
        calls.append(1)
        async with start_simulator("vllm", "prefill", tmp_path, extra_args=["--sim-no-such-flag"]) as p:
            yield p

    async with AsyncExitStack() as es:
        with pytest.raises(RuntimeError, match="exited with"):
            await start_until_bound(es, "sim", start)
    assert calls == [1]


@pytest.mark.slow
async def test_start_engines_gives_every_prefill_its_own_kv_event_ports(tmp_path: Path) -> None:
    async with start_engines("vllm", tmp_path, ZERO, prefills=3, decodes=1, kv_events=True) as engines:
        kv = [(p.extra["kv_events_port"], p.extra["kv_events_replay_port"]) for p in engines.prefills]
        flat = [port for pair in kv for port in pair]
        others = [p.port for p in (*engines.prefills, *engines.decodes)] + \
                 [p.extra["side_channel_port"] for p in engines.prefills]
        assert len(set(flat)) == 6 and not set(flat) & set(others)
        assert all(_outside_ephemeral(port) for port in flat)
        for p, (pub, replay) in zip(engines.prefills, kv, strict=True):
            assert p.alive() and re.search(rf"KV events published on tcp://[^ ]+:{pub} \(replay tcp://[^ ]+:{replay}\)",
                                           p.log())
            assert f",kv_events={pub},kv_events_replay={replay}" in engines.endpoint_arg(p)
