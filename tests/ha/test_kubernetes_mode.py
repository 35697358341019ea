"""Coordinator HA life cycle with real processes and a real etcd (no engines needed):

* the new master announces itself to the controller (``ReportAlarm`` COORDINATOR_PROMOTED with its
  own address, management key attached), retried until accepted;
* Kubernetes mode (``ha.exit_on_lost``): a master that lost the lock exits non-zero (75);
* a gracefully stopped master revokes its lease: a standby takes over at once (≈ its check interval).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import grpc
import pytest

from motor_common.gen.motor.controller.v1 import controller_pb2 as ctl
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as ctl_grpc
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_server import GrpcServer, ServerConfig
from motor_common.runner import EXIT_RESCHEDULE
from tests.etcd_server import etcd_server
from tests.helpers import wait_for
from tests.procs import Proc, start_coordinator

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.timeout(120)]

KEY = "ha-k8s-key"


class FakeController(ctl_grpc.ControllerServiceServicer):
    def __init__(self) -> None:
        self.alarms: list[ctl.Alarm] = []
        self.reject_first = 1

    async def ReportAlarm(self, request: ctl.ReportAlarmRequest, context: Any) -> ctl.ReportAlarmResponse:
        self.alarms.append(request.alarm)
        if self.reject_first > 0:
            self.reject_first -= 1
            return ctl.ReportAlarmResponse(accepted=False)
        return ctl.ReportAlarmResponse(accepted=True)


@asynccontextmanager
async def fake_controller() -> AsyncIterator[tuple[str, FakeController]]:
    fake = FakeController()
    server = GrpcServer("fake-controller", ServerConfig(port=0), management_key=KEY)
    server.add_service("motor.controller.v1.ControllerService",
                       lambda s: ctl_grpc.add_ControllerServiceServicer_to_server(fake, s),
                       protected=True)
    port = await server.start()
    try:
        yield f"127.0.0.1:{port}", fake
    finally:
        await server.stop(0)


async def role(address: str) -> int | None:
    async with grpc.aio.insecure_channel(address) as ch:
        try:
            resp = await cgrpc.DispatchServiceStub(ch).GetReadiness(
                cpb.GetReadinessRequest(), timeout=0.5)
        except grpc.aio.AioRpcError:
            return None
        return int(resp.role)


async def is_master(address: str) -> bool:
    return await role(address) == cpb.COORDINATOR_ROLE_MASTER


async def test_promotion_announced_lost_master_exits_and_graceful_stop_hands_over_at_once(
    tmp_path: Any,
) -> None:
    async with AsyncExitStack() as es:
        etcd = await es.enter_async_context(etcd_server())
        controller, fake = await es.enter_async_context(fake_controller())
        cfg = {"master_lock_ttl": 3, "master_standby_check_interval": 0.5,
               "controller_address": controller,
               # no instance set is ever pushed here: campaign at once (docs/ha.md)
               "ha": {"etcd_endpoints": [etcd.endpoint], "exit_on_lost": True, "unsynced_campaign_delay_sec": 0}}
        procs: list[Proc] = []
        for name in ("k-a", "k-b", "k-c"):
            procs.append(await es.enter_async_context(
                start_coordinator(tmp_path, cfg, management_key=KEY, name=name)))
            if name == "k-a":
                await wait_for(lambda: is_master(procs[0].address), timeout=10, what="a master")
        a, b, c = procs
        # 1. The first master announced itself (after one refusal: retried).
        await wait_for(lambda: any(x.address == a.address for x in fake.alarms[1:]), timeout=10,
                       what="a's promotion accepted")
        first = fake.alarms[0]
        assert first.kind == ctl.ALARM_KIND_COORDINATOR_PROMOTED and first.address == a.address
        assert first.source == f"coordinator@{a.address}"

        # 2. Freeze a beyond its lease: another coordinator wins; a, resumed, exits 75.
        os.kill(a.pid, signal.SIGSTOP)
        try:
            async def other_master() -> str:
                for p in (b, c):
                    if await is_master(p.address):
                        return p.address
                return ""

            new = await wait_for(other_master, timeout=10, what="a new master")
        finally:
            os.kill(a.pid, signal.SIGCONT)
        await wait_for(lambda: a.popen.poll() is not None, timeout=10, what="a exits after losing the lock")
        assert a.popen.returncode == EXIT_RESCHEDULE
        assert "lost the master lock: exiting" in a.log()
        await wait_for(lambda: any(x.address == new for x in fake.alarms), timeout=10,
                       what="the new master's promotion alarm")

        # 3. Graceful stop of the master: the lease is revoked, the last standby wins at once.
        master = b if new == b.address else c
        standby = c if master is b else b
        stopped_at = time.monotonic()
        os.kill(master.pid, signal.SIGTERM)
        await wait_for(lambda: is_master(standby.address), timeout=5,
                       interval=0.02, what="the standby takes over")
        takeover = time.monotonic() - stopped_at
        await asyncio.to_thread(master.popen.wait, 10)
        assert master.popen.returncode == 0
        print(f"\n[ha] graceful stop: standby master {takeover:.2f}s after SIGTERM")
        assert takeover < 1.5
