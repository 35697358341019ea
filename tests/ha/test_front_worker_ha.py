"""Active/standby coordinators whose master runs its co-located front as worker processes
(``http.workers: 2``): real etcd, two real ``motor-coordinator`` processes, simulated vLLM P and D.

The workers mirror the master's leadership from the coordinator's Sync stream; they cannot ask the
election. The coordinator process frozen (SIGSTOP on it alone: its workers keep running) stops
sending, its lease expires and the standby takes over. Before the fix the workers went on serving
as master for as long as the freeze lasted (two masters serving at once). Now each leadership
message carries the lease's validity bound, renewed at every renewal: past it the workers read the
master as isolated, so at most one ready master, front workers included.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from contextlib import AsyncExitStack
from pathlib import Path

import grpc
import pytest

from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from tests.e2e.test_standalone import register_engines
from tests.etcd_server import etcd_server
from tests.helpers import wait_for
from tests.procs import Proc, start_coordinator, start_simulator
from tests.worker_fronts import MODEL, Client, all_ready, worker_pids

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.asyncio, pytest.mark.timeout(120)]

KEY = "front-worker-ha-management-key"
TTL = 3.0


async def _readiness(address: str) -> cpb.GetReadinessResponse | None:
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            resp: cpb.GetReadinessResponse = await cgrpc.DispatchServiceStub(channel).GetReadiness(
                cpb.GetReadinessRequest(), timeout=0.5)
            return resp
        except grpc.aio.AioRpcError:
            return None


async def _answers_per_worker(front: Proc, connections: int = 12) -> dict[int, list[tuple[int, str, int]]]:
    """(``/ready`` status, its reason, a completion's status) on fresh connections, by worker."""
    seen: dict[int, list[tuple[int, str, int]]] = {}
    for _ in range(connections):
        c = Client(front)
        try:
            pid = await c.connect()
            async with c.session.get(c.gateway.url + "/ready") as r:
                ready, reason = r.status, (await r.json(content_type=None)).get("reason", "")
            async with c.session.post(c.gateway.url + "/v1/completions", json={
                    "model": MODEL, "prompt": "hello", "max_tokens": 2}) as r:
                await r.read()
                seen.setdefault(pid, []).append((ready, reason, r.status))
        finally:
            await c.close()
    return seen


async def test_a_frozen_masters_front_workers_stop_serving_before_the_standby_takes_over(tmp_path: Path) -> None:
    logs = tmp_path
    async with AsyncExitStack() as es:
        etcd = await es.enter_async_context(etcd_server())
        prefill = await es.enter_async_context(start_simulator("vllm", "prefill", logs, model=MODEL))
        decode = await es.enter_async_context(start_simulator("vllm", "decode", logs, model=MODEL))
        ha = {"master_lock_ttl": TTL, "master_standby_check_interval": 0.5,
              "ha": {"etcd_endpoints": [etcd.endpoint], "election_key": "/motor/front-worker-ha/leader",
                     "unsynced_campaign_delay_sec": 0}}
        a = await es.enter_async_context(start_coordinator(
            logs, {**ha, "http": {"port": 0, "workers": 2}}, management_key=KEY, name="coord-a"))

        async def is_master(address: str) -> bool:
            v = await _readiness(address)
            return v is not None and v.role == cpb.COORDINATOR_ROLE_MASTER

        await wait_for(lambda: is_master(a.address), timeout=20, what="coord-a master")
        b = await es.enter_async_context(start_coordinator(logs, ha, management_key=KEY, name="coord-b"))
        (logs / "cli.key").write_text(KEY)
        for c in (a, b):
            await register_engines(c.address, logs / "cli.key", MODEL, "vllm",
                                   (("prefill", prefill), ("decode", decode)))
        front = dataclasses.replace(a, port=int(a.ports["http"]))
        await wait_for(lambda: all_ready(front), timeout=30, what="both front workers ready")

        # Steady state over more than a lease TTL: the bound is renewed, the workers keep serving.
        until = time.monotonic() + TTL + 1
        while time.monotonic() < until:
            steady = await _answers_per_worker(front, connections=4)
            assert all(s == (200, "", 200) for answers in steady.values() for s in answers), steady

        assert len(worker_pids(front)) == 2
        os.kill(a.pid, signal.SIGSTOP)  # the coordinator process only: its workers keep running
        try:
            async def b_ready_master() -> bool:
                v = await _readiness(b.address)
                return v is not None and v.ready and v.role == cpb.COORDINATOR_ROLE_MASTER

            await wait_for(b_ready_master, timeout=15, what="coord-b ready master")
            seen = await _answers_per_worker(front)
        finally:
            os.kill(a.pid, signal.SIGCONT)
        assert seen.keys() == worker_pids(front), seen  # both workers answered
        # Every answer of the frozen master's workers: not ready (isolated), request refused 503.
        assert all(s == (503, "isolated", 503) for answers in seen.values() for s in answers), seen
        # Resumed, coord-a learns it lost the lock: its workers then say standby.
        await wait_for(lambda: _all_standby(front), timeout=15, what="coord-a's workers standby")


async def _all_standby(front: Proc) -> bool:
    seen = await _answers_per_worker(front, connections=6)
    return all(s[1] == "Coordinator is not master" for answers in seen.values() for s in answers)
