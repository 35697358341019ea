"""The coordinator's co-located front with ``http.workers: 2`` against real processes: four
simulated vLLM engines (2 prefill, 2 decode) and a real ``motor-coordinator`` whose front is two
worker processes on one port (policy ``prefix_aware``: prefill by prompt prefix, decode by least
load).

Each worker dispatches itself, with its own scheduler; what must nevertheless hold for the front
as a whole (which worker took a connection is read from the kernel, as in
tests/gateway/test_workers.py):

* connections spread over the workers, and the front's ``/metrics`` sums them whichever worker
  answers, with the supervisor's gauges;
* least load sees the other worker's request in flight (its report reaches this worker through
  the coordinator), and a prompt prefix goes to the same prefill from either worker;
* an instance set change reaches every worker;
* a killed worker is replaced, logged and counted, and the port keeps serving; SIGTERM drains the
  requests in flight on every worker and the coordinator exits 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from tests.e2e.test_standalone import motor_cli, register_engines
from tests.gateway.test_workers import (
    Client,
    _all_ready,
    _ready_on,
    _running,
    client_on,
    closing,
    gateway_metric,
    served,
    worker_pids,
)
from tests.helpers import wait_for
from tests.procs import Proc, start_coordinator, start_simulator

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(240)]

MODEL = "tiny"
KEY = "front-workers-management-key"


@dataclass
class Fleet:
    coordinator: Proc
    front: Proc  # the coordinator process, with .port = its front's HTTP port
    logs: Path
    prefills: list[Proc]
    decodes: list[Proc]
    cli_env: dict[str, str]


def _front(coordinator: Proc) -> Proc:
    return dataclasses.replace(coordinator, port=int(coordinator.ports["http"]))


async def _start(logs: Path, es: AsyncExitStack, name: str, **http: object) -> Proc:
    coordinator = await es.enter_async_context(start_coordinator(
        logs, {"server": {"metrics_port": 0}, "scheduler": {"policy": "prefix_aware"},
               # Load = the front's own in-flight counts, not also the engines' scraped queues
               # (a scrape taken while the other decode served a request would tie them).
               "dispatch": {"metrics_scrape_interval_sec": 0},
               "http": {"port": 0, "workers": 2, **http}}, management_key=KEY, name=name))
    return coordinator


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Fleet]:
    logs = tmp_path_factory.mktemp("front-workers")
    async with AsyncExitStack() as es:
        prefills = [await es.enter_async_context(start_simulator("vllm", "prefill", logs, model=MODEL, name=f"p{i}"))
                    for i in range(2)]
        decodes = [await es.enter_async_context(start_simulator("vllm", "decode", logs, model=MODEL, name=f"d{i}"))
                   for i in range(2)]
        coordinator = await _start(logs, es, "coordinator")
        front = _front(coordinator)
        assert len(worker_pids(front)) == 2  # the ports file is written once both serve
        (logs / "cli.key").write_text(KEY)
        env = await register_engines(coordinator.address, logs / "cli.key", MODEL, "vllm",
                                     [*(("prefill", s) for s in prefills), *(("decode", s) for s in decodes)])
        await wait_for(lambda: _all_ready(front), timeout=60, what="both workers ready")
        yield Fleet(coordinator, front, logs, prefills, decodes, env)


async def in_flight_seen(client: Client, instance_count: int) -> list[float]:
    """``motor_coordinator_instance_requests_in_flight`` per instance as the worker on *client*'s
    connection sees it (its own requests and the other workers' reports)."""
    async with client.session.get(client.gateway.url + "/metrics") as r:
        text = await r.text()
    rows = [line for line in text.splitlines() if line.startswith("motor_coordinator_instance_requests_in_flight{")]
    assert len(rows) == instance_count, rows
    return [float(line.rsplit(" ", 1)[1]) for line in rows]


async def test_connections_spread_over_the_workers_and_metrics_sum_them(fleet: Fleet) -> None:
    name = 'motor_gateway_requests_total{route="/v1/completions",status="200"'
    probe = Client(fleet.front)
    async with closing(probe):
        await probe.connect()
        before = await gateway_metric(probe, name)
    clients = [Client(fleet.front) for _ in range(16)]
    async with closing(*clients):
        pids = [await c.connect() for c in clients]
        for i, c in enumerate(clients):
            assert (await c.complete(f"spread {i}"))["choices"]
        # 16 connections on 2 workers: both took some (all on one: probability 2^-15).
        assert set(pids) == worker_pids(fleet.front) and len(set(pids)) == 2
    a = await client_on(fleet.front, lambda pid: pid == pids[0], "a connection on the first worker")
    b = await client_on(fleet.front, lambda pid: pid != pids[0], "a connection on the other worker")
    async with closing(a, b):
        assert await gateway_metric(a, name) == before + 16
        assert await gateway_metric(b, name) == before + 16
        assert await gateway_metric(a, "motor_coordinator_front_workers") == 4  # configured 2 + running 2


async def test_least_load_sees_the_in_flight_request_of_another_worker(fleet: Fleet) -> None:
    a = await client_on(fleet.front, lambda _: True, "a connection")
    b = await client_on(fleet.front, lambda pid: pid != a.worker, "a connection on the other worker")
    async with closing(a, b):
        # Worker A holds a long streamed answer open on one decode engine.
        resp = await a.session.post(fleet.front.url + "/v1/completions", json={
            "model": MODEL, "prompt": "a long story", "max_tokens": 2000, "stream": True})
        assert resp.status == 200
        await resp.content.readline()  # the first event: decoding has started
        running = await wait_for(
            lambda: _running(fleet.decodes), timeout=20, what="the long stream running on one decode engine")
        busy = running.index(1.0)
        # Worker B counts A's request (reported through the coordinator) ...
        seen = await wait_for(lambda: _seen_busy(b), timeout=10, what="worker B seeing A's request in flight")
        assert sum(seen) == 1
        # ... so all of B's requests go to the other decode engine.
        before = await served(fleet.decodes)
        for i in range(4):
            await b.complete(f"while busy {i}")
        after = await served(fleet.decodes)
        assert after[busy] == before[busy]
        assert after[1 - busy] == before[1 - busy] + 4
        resp.close()
    await wait_for(lambda: _running(fleet.decodes, total=0), timeout=30, what="the stream cancelled")


async def _seen_busy(c: Client) -> list[float] | None:
    seen = await in_flight_seen(c, 4)
    return seen if sum(seen) == 1 else None


async def test_a_prefix_goes_to_the_same_prefill_engine_from_either_worker(fleet: Fleet) -> None:
    a = await client_on(fleet.front, lambda _: True, "a connection")
    b = await client_on(fleet.front, lambda pid: pid != a.worker, "a connection on the other worker")
    homes: set[int] = set()
    async with closing(a, b):
        for n in range(6):
            prompt = f"system prompt number {n}: " + "you are a helpful assistant. " * 8
            engines = []
            for client in (a, b, a, b):
                before = await served(fleet.prefills)
                await client.complete(prompt + f"question from {client.worker}")
                after = await served(fleet.prefills)
                moved = [i for i in range(2) if after[i] != before[i]]
                assert len(moved) == 1, (before, after)
                engines.append(moved[0])
            assert len(set(engines)) == 1, f"prefix {n} went to prefills {engines}"
            homes.add(engines[0])
    assert homes == {0, 1}, "6 prefixes all hashed to one prefill: the ring is not spreading"


async def test_an_instance_set_change_reaches_every_worker(fleet: Fleet) -> None:
    gone = fleet.decodes[0]
    rc, out, err = await motor_cli("register", "del", "--endpoint", f"127.0.0.1:{gone.port}", env=fleet.cli_env)
    assert rc == 0, out + err
    try:
        a = await client_on(fleet.front, lambda _: True, "a connection")
        b = await client_on(fleet.front, lambda pid: pid != a.worker, "a connection on the other worker")
        async with closing(a, b):
            for c in (a, b):
                await wait_for(lambda c=c: _instances_seen(c, 3), timeout=10, what="the worker mirroring the delete")
            before = await served(fleet.decodes)
            for i, c in enumerate((a, b, a, b)):
                await c.complete(f"after the delete {i}")
            after = await served(fleet.decodes)
            assert after[0] == before[0] and after[1] == before[1] + 4
    finally:
        await register_engines(fleet.coordinator.address, fleet.logs / "cli.key", MODEL, "vllm", [("decode", gone)])
        await wait_for(lambda: _all_ready(fleet.front), timeout=60, what="both workers ready")


async def _instances_seen(c: Client, n: int) -> bool:
    async with c.session.get(c.gateway.url + "/metrics") as r:
        text = await r.text()
    return f"motor_coordinator_registry_instances {float(n)}" in text


async def test_a_killed_worker_is_restarted_and_the_port_keeps_serving(fleet: Fleet) -> None:
    old = worker_pids(fleet.front)
    victim = min(old)
    os.kill(victim, signal.SIGKILL)
    new = await wait_for(lambda: (lambda p: p if len(p) == 2 and victim not in p else None)(worker_pids(fleet.front)),
                         timeout=30, what="the killed worker replaced")
    assert len(new & old) == 1
    assert "coordinator front worker died; restarting it" in fleet.coordinator.log()
    assert f"pid={victim} code=-9 reason=exited" in fleet.coordinator.log()
    (fresh,) = new - old
    c = await client_on(fleet.front, lambda pid: pid == fresh, "a connection on the new worker")
    async with closing(c):
        # the new worker gets the instance set from the coordinator: ready, and it serves
        await wait_for(lambda: _ready_on(c), timeout=30, what="the new worker ready")
        assert (await c.complete("after the restart"))["choices"]
        assert await gateway_metric(c, 'motor_coordinator_front_worker_restarts_total{reason="exited"') >= 1
        assert await gateway_metric(c, 'motor_coordinator_front_workers{state="running"') == 2


async def test_sigterm_drains_the_requests_of_every_worker(fleet: Fleet) -> None:
    async with AsyncExitStack() as es:
        coordinator = await _start(fleet.logs, es, "c-drain", shutdown_grace_sec=30)
        front = _front(coordinator)
        await register_engines(coordinator.address, fleet.logs / "cli.key", MODEL, "vllm",
                               [("prefill", fleet.prefills[0]), ("decode", fleet.decodes[0])])
        await wait_for(lambda: _all_ready(front), timeout=60, what="both workers ready")
        a = await client_on(front, lambda _: True, "a connection")
        b = await client_on(front, lambda pid: pid != a.worker, "a connection on the other worker")
        async with closing(a, b):
            streams = [await c.session.post(front.url + "/v1/completions", json={
                "model": MODEL, "prompt": f"drain {i}", "max_tokens": 300, "stream": True})
                for i, c in enumerate((a, b))]
            for s in streams:
                assert s.status == 200
                await s.content.readline()
            coordinator.popen.send_signal(signal.SIGTERM)
            bodies = [await s.read() for s in streams]
            for body in bodies:
                assert body.rstrip().endswith(b"data: [DONE]"), body[-200:]
            code = await asyncio.to_thread(coordinator.popen.wait, 60)
            assert code == 0, coordinator.log()[-3000:]
