"""The coordinator's co-located front with ``http.workers: 2`` against real processes: four
simulated vLLM engines (2 prefill, 2 decode) and a real ``motor-coordinator`` whose front is two
worker processes on one port (policy ``prefix_aware``: prefill by prompt prefix, decode by least
load).

Each worker dispatches itself, with its own scheduler; what must nevertheless hold for the front
as a whole (the checks of ``tests/worker_fronts.py``, which gateway workers pass too):

* connections spread over the workers, and the front's ``/metrics`` sums them whichever worker
  answers, with the supervisor's gauges;
* least load sees the other worker's request in flight (its report reaches this worker through
  the coordinator), and a prompt prefix goes to the same prefill from either worker;
* an instance set change reaches every worker;
* a killed worker is replaced, logged and counted, and the port keeps serving; SIGTERM drains the
  requests in flight on every worker and the coordinator exits 0.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
import pytest
import pytest_asyncio

from tests.e2e.test_standalone import motor_cli, register_engines
from tests.helpers import wait_for
from tests.procs import Proc, start_coordinator, start_simulator
from tests.worker_fronts import (
    MODEL,
    Client,
    a_killed_worker_is_replaced,
    a_prefix_stays_on_one_prefill,
    all_ready,
    closing,
    connections_spread_and_metrics_sum,
    least_load_sees_another_workers_request,
    served,
    sigterm_drains_every_worker,
    two_clients,
    worker_pids,
)

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(240)]

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
        await wait_for(lambda: all_ready(front), timeout=60, what="both workers ready")
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
    await connections_spread_and_metrics_sum(fleet.front, "motor_coordinator_front_workers")


async def test_least_load_sees_the_in_flight_request_of_another_worker(fleet: Fleet) -> None:
    # worker B counts worker A's request (A's report, relayed by the coordinator) before B's
    # requests are sent: then they all go to the other decode engine
    await least_load_sees_another_workers_request(
        fleet.front, fleet.decodes,
        seen=lambda b: wait_for(lambda: _seen_busy(b), timeout=10, what="worker B seeing A's request in flight"))


async def _seen_busy(c: Client) -> bool:
    return sum(await in_flight_seen(c, 4)) == 1


async def test_a_prefix_goes_to_the_same_prefill_engine_from_either_worker(fleet: Fleet) -> None:
    await a_prefix_stays_on_one_prefill(fleet.front, fleet.prefills)


async def test_an_instance_set_change_reaches_every_worker(fleet: Fleet) -> None:
    gone = fleet.decodes[0]
    rc, out, err = await motor_cli("register", "del", "--endpoint", f"127.0.0.1:{gone.port}", env=fleet.cli_env)
    assert rc == 0, out + err
    try:
        a, b = await two_clients(fleet.front)
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
        await wait_for(lambda: all_ready(fleet.front), timeout=60, what="both workers ready")


async def _instances_seen(c: Client, n: int) -> bool:
    async with c.session.get(c.gateway.url + "/metrics") as r:
        text = await r.text()
    return f"motor_coordinator_registry_instances {float(n)}" in text


async def test_a_killed_worker_is_restarted_and_the_port_keeps_serving(fleet: Fleet) -> None:
    # the new worker gets the instance set from the coordinator: ready, and it serves
    await a_killed_worker_is_replaced(fleet.front, "coordinator front", "motor_coordinator_front")


async def test_sigterm_drains_the_requests_of_every_worker(fleet: Fleet) -> None:
    async with AsyncExitStack() as es:
        coordinator = await _start(fleet.logs, es, "c-drain", shutdown_grace_sec=30)
        front = _front(coordinator)
        await register_engines(coordinator.address, fleet.logs / "cli.key", MODEL, "vllm",
                               [("prefill", fleet.prefills[0]), ("decode", fleet.decodes[0])])
        await wait_for(lambda: all_ready(front), timeout=60, what="both workers ready")
        await sigterm_drains_every_worker(front, "coordinator front")


async def test_the_sync_service_is_private(fleet: Fleet) -> None:
    """FrontWorkerService is not on the coordinator's gRPC port, only on a unix socket in a
    directory only the coordinator's user can open; the load board is that user's alone too."""
    async with grpc.aio.insecure_channel(fleet.coordinator.address) as ch:
        sync = ch.stream_stream("/motor.coordinator.v1.FrontWorkerService/Sync")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            # no message: one sent can lose the race with the refusal (INTERNAL "Internal error
            # from Core" locally, seen under load), and only the server's status must end the call
            async for _ in sync(iter([]), timeout=5):
                pass
        assert refused.value.code() is grpc.StatusCode.UNIMPLEMENTED
    workers = psutil.Process(fleet.coordinator.pid).children()
    board = next(w.cmdline()[w.cmdline().index("--board") + 1] for w in workers)
    directory = os.path.dirname(board)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(board).st_mode) == 0o600
    assert os.path.exists(os.path.join(directory, "sync.sock"))
