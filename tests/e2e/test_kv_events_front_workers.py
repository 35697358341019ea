"""KV-event routing with the co-located front as two worker processes (`motor up --kv-events
--co-located --front-workers 2`, real processes): each worker follows the engines' KV events
itself (its own subscriber and index), so a repeated prefix goes to the engine that holds it
whichever worker took the request. Checked on each worker's own /metrics (its index and its
policy's decisions, read over a connection the kernel gave that worker) against the engine's own
event stream and counters."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from motor_common.kv_events import Flavour
from tests.e2e.test_kv_events_routing import (
    SYSTEM,
    KvFleet,
    _engine_counters,
    _engine_held,
    _has_keys,
    _holder,
)
from tests.helpers import wait_for
from tests.motor_up import motor_up
from tests.worker_fronts import Client, closing, front_metric, two_clients

pytestmark = pytest.mark.slow


class _Front:
    """The co-located coordinator as tests.worker_fronts sees a front: its pid and HTTP port."""

    def __init__(self, pid: int, port: int) -> None:
        self.pid, self.port = pid, port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _coordinator_pid(up_pid: int) -> int:
    for p in psutil.Process(up_pid).children(recursive=True):
        cmd = " ".join(p.cmdline())
        if "motor-coordinator" in cmd or "motor_coordinator.main" in cmd:
            return int(p.pid)
    raise AssertionError("no coordinator process under motor up")


async def _chat(c: Client, user: str) -> None:
    async with c.session.post(c.gateway.url + "/v1/chat/completions", json={
            "model": "tiny", "max_tokens": 2,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]}) as r:
        body = await r.read()
        assert r.status == 200, body


async def _worker_blocks(c: Client, engine: str, n: int) -> bool:
    return await front_metric(c, f'motor_coordinator_kv_index_blocks{{engine="{engine}"') == n


async def test_every_front_worker_routes_a_prefix_to_the_engine_that_reports_it(tmp_path: Path) -> None:
    async with motor_up(tmp_path, "--kv-events", "--co-located", "--front-workers", "2", "--prefill", "2",
                        "--decode", "1", timeout=150) as up:
        f = KvFleet(up, Flavour.VLLM)
        eps = await f.prefill_endpoints()
        assert len(eps) == 2
        await wait_for(lambda: _has_keys(f, set(eps)), timeout=30, what="the coordinator follows both prefills")
        front = _Front(_coordinator_pid(up.proc.pid), int(up.info["gateway_url"].rsplit(":", 1)[1]))
        a, b = await two_clients(front)  # type: ignore[arg-type]
        async with closing(a, b):
            await _chat(a, "question zero")
            holder = await wait_for(lambda: _holder(f, eps), timeout=20, what="one prefill engine holds the prefix")
            other = next(k for k in eps if k != holder)
            held = len(await _engine_held(eps[holder].kv_events_replay_port, Flavour.VLLM))
            for c in (a, b):  # each worker's own index holds what the engine's stream says
                await wait_for(lambda c=c: _worker_blocks(c, holder, held), timeout=20,
                               what=f"worker {c.worker}'s index follows the holder")
            name = 'motor_coordinator_kv_events_decisions_total{decision="prefix"'
            before = [await front_metric(c, name) for c in (a, b)]
            oq0, _ = await _engine_counters(eps[other].business_port)
            for i in range(4):
                await _chat((a, b)[i % 2], f"question {i + 1}")
            oq1, _ = await _engine_counters(eps[other].business_port)
            assert oq1 == oq0, "the engine without the prefix got a request"
            after = [await front_metric(c, name) for c in (a, b)]
            # each worker routed its two requests by the held prefix (not the ring: it saw the events)
            assert [x - y for x, y in zip(after, before, strict=True)] == [2, 2]
