"""``motor-gateway`` with ``workers: 2`` against real processes: four simulated vLLM engines
(2 prefill, 2 decode), a real ``motor-coordinator`` (policy ``prefix_aware``: prefill by prompt
prefix, decode by least load of its in-flight counts) and a real gateway whose supervisor runs two worker processes on
one port.

Which worker took a connection is read from the kernel (``tests/worker_fronts.py``, whose checks
the co-located front's workers pass too). What must hold:

* connections spread over the workers, and ``/metrics`` sums them whichever worker answers;
* the scheduling state is the coordinator's, so one worker's in-flight request steers another
  worker's next request to the other decode engine (least load), and a prompt prefix goes to the
  same prefill engine whichever worker took it;
* a worker killed (-9) or wedged (SIGSTOP: no heartbeat) is replaced, logged and counted, and the
  port keeps serving; SIGTERM to the parent drains the requests in flight on every worker;
* the admission limits are the whole front's: with two workers, ``max_in_flight_per_model: 2``
  lets two requests of the model through in total, not two per worker.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil
import pytest
import pytest_asyncio

from tests.e2e.test_standalone import register_engines
from tests.helpers import wait_for
from tests.procs import Proc, start_coordinator, start_gateway, start_simulator
from tests.worker_fronts import (
    MODEL,
    Client,
    a_killed_worker_is_replaced,
    a_prefix_stays_on_one_prefill,
    all_ready,
    client_on,
    closing,
    connections_spread_and_metrics_sum,
    front_metric,
    least_load_sees_another_workers_request,
    running,
    sigterm_drains_every_worker,
    worker_pids,
)

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(240)]

KEY = "workers-management-key"


@dataclass
class Fleet:
    coordinator: Proc
    gateway: Proc
    logs: Path
    prefills: list[Proc]
    decodes: list[Proc]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Fleet]:
    logs = tmp_path_factory.mktemp("workers")
    async with AsyncExitStack() as es:
        prefills = [await es.enter_async_context(start_simulator("vllm", "prefill", logs, model=MODEL, name=f"p{i}"))
                    for i in range(2)]
        decodes = [await es.enter_async_context(start_simulator("vllm", "decode", logs, model=MODEL, name=f"d{i}"))
                   for i in range(2)]
        coordinator = await es.enter_async_context(start_coordinator(
            logs, {"server": {"metrics_port": 0}, "scheduler": {"policy": "prefix_aware"},
                   # Load = the coordinator's own in-flight counts (what every worker's requests
                   # add to), not also the engines' scraped queues: a scrape taken while the other
                   # decode served a request would tie the two and make the choice round robin.
                   "dispatch": {"metrics_scrape_interval_sec": 0}}, management_key=KEY))
        (logs / "cli.key").write_text(KEY)
        await register_engines(coordinator.address, logs / "cli.key", MODEL, "vllm",
                               [*(("prefill", s) for s in prefills), *(("decode", s) for s in decodes)])
        gateway = await es.enter_async_context(start_gateway(logs, [coordinator.address], name="gw",
                                                             config={"workers": 2}))
        await wait_for(lambda: len(worker_pids(gateway)) == 2, timeout=30, what="two gateway workers")
        await wait_for(lambda: all_ready(gateway), timeout=60, what="both workers ready")
        yield Fleet(coordinator, gateway, logs, prefills, decodes)


async def test_connections_spread_over_the_workers_and_metrics_sum_them(fleet: Fleet) -> None:
    await connections_spread_and_metrics_sum(fleet.gateway, "motor_gateway_workers")


async def test_least_load_sees_the_in_flight_request_of_another_worker(fleet: Fleet) -> None:
    # the coordinator counts worker A's request: worker B's all go to the other decode engine
    await least_load_sees_another_workers_request(fleet.gateway, fleet.decodes)


async def test_a_prefix_goes_to_the_same_prefill_engine_from_either_worker(fleet: Fleet) -> None:
    await a_prefix_stays_on_one_prefill(fleet.gateway, fleet.prefills)


async def test_a_killed_worker_is_restarted_and_the_port_keeps_serving(fleet: Fleet) -> None:
    await a_killed_worker_is_replaced(fleet.gateway, "gateway", "motor_gateway")


async def _own_gateway(fleet: Fleet, es: AsyncExitStack, name: str, **config: object) -> Proc:
    gw = await es.enter_async_context(start_gateway(fleet.logs, [fleet.coordinator.address], name=name,
                                                    config={"workers": 2, **config}))
    await wait_for(lambda: len(worker_pids(gw)) == 2, timeout=30, what=f"{name}: two workers")
    await wait_for(lambda: all_ready(gw), timeout=60, what=f"{name}: both workers ready")
    return gw


async def test_a_wedged_worker_is_killed_and_restarted(fleet: Fleet) -> None:
    async with AsyncExitStack() as es:
        gw = await _own_gateway(fleet, es, "gw-wedge", worker_liveness_timeout_sec=4)
        old = worker_pids(gw)
        victim = min(old)
        os.kill(victim, signal.SIGSTOP)  # alive, listening, but its event loop never runs
        try:
            await wait_for(lambda: victim not in worker_pids(gw) and len(worker_pids(gw)) == 2,
                           timeout=40, what="the wedged worker replaced")
        finally:
            if psutil.pid_exists(victim):
                os.kill(victim, signal.SIGCONT)
        assert "gateway worker unresponsive (no heartbeat); killing it worker=" in gw.log()
        assert f"pid={victim} code=-9 reason=unresponsive" in gw.log()
        await wait_for(lambda: all_ready(gw), timeout=60, what="both workers ready again")
        c = await client_on(gw, lambda _: True, "a connection")
        async with closing(c):
            # the metric counts every kill the log shows (not "== 1": a healthy worker whose loop a
            # loaded box stalls past the 4 s liveness timeout is killed too, and counted)
            async def counted() -> bool:
                kills = gw.log().count("reason=unresponsive")
                metric = await front_metric(c, 'motor_gateway_worker_restarts_total{reason="unresponsive"')
                return kills >= 1 and metric == kills

            await wait_for(counted, timeout=10, what="every unresponsive kill in the log counted")


async def test_sigterm_drains_the_requests_of_every_worker(fleet: Fleet) -> None:
    async with AsyncExitStack() as es:
        gw = await _own_gateway(fleet, es, "gw-drain", shutdown_grace_sec=30)
        await sigterm_drains_every_worker(gw, "gateway")


async def test_admission_limits_are_the_whole_fronts_not_per_worker(fleet: Fleet) -> None:
    async with AsyncExitStack() as es:
        gw = await _own_gateway(fleet, es, "gw-admission",
                                admission={"max_in_flight_per_model": 2, "max_queued_per_model": 0})
        first = await client_on(gw, lambda _: True, "a connection")
        clients = [first]
        for i in range(5):  # three connections on each worker
            on_first = sum(c.worker == first.worker for c in clients) < 3
            clients.append(await client_on(gw, lambda pid, f=on_first: (pid == first.worker) == f,
                                           f"connection {i + 2} on the chosen worker"))
        async with closing(*clients):
            assert {c.worker for c in clients} == worker_pids(gw)

            async def ask(c: Client) -> tuple[int, aiohttp.ClientResponse]:
                # A long stream (seconds of decode): an admitted one holds its slot until closed.
                r = await c.session.post(gw.url + "/v1/completions", json={
                    "model": MODEL, "prompt": "hold a slot", "max_tokens": 2000, "stream": True})
                if r.status == 200:
                    await r.content.readline()  # decoding has started
                else:
                    await r.read()
                return r.status, r

            answers = await asyncio.gather(*(ask(c) for c in clients))
            try:
                statuses = [status for status, _ in answers]
                # Each worker's share is 1: one stream per worker, the other four refused.
                assert sorted(statuses) == [200, 200, 429, 429, 429, 429], statuses
                assert {c.worker for c, s in zip(clients, statuses, strict=True) if s == 200} == worker_pids(gw)
                # The front's in-flight gauge (summed over the workers) says the same.
                probe = Client(gw)
                async with closing(probe):
                    assert await front_metric(probe, "motor_gateway_admission_in_flight") == 2
            finally:
                for _, r in answers:
                    r.close()
    await wait_for(lambda: running(fleet.decodes, total=0), timeout=30, what="the streams cancelled")
