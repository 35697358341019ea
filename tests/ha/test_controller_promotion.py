"""The controller's reaction to a coordinator promotion, with real processes: etcd, two HA
``motor-coordinator`` processes that announce their promotion to a real ``motor-controller``,
and fake nodemanagers (real gRPC) that give the controller two ACTIVE instances.

The controller is configured with **no** coordinator: each master is added as a push target at
its own address when it announces itself. After the master is frozen (SIGSTOP) the new master
must hold the controller's full instance set within ~1-2 s of its promotion, without any
``motor register``.

Run: ``.venv/bin/pytest tests/ha/test_controller_promotion.py -s`` (prints the measurement).
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import AsyncExitStack
from pathlib import Path

import grpc
import pytest

from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as pbgrpc
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_client import call_metadata, open_channel
from tests.controller.fakes import KEY, FakeNodeManager
from tests.etcd_server import etcd_server
from tests.helpers import wait_for
from tests.procs import Proc, start_controller, start_coordinator

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.timeout(60)]

CONTROLLER = {
    "heartbeat_interval_sec": 0.2,
    "heartbeat_timeout_sec": 1.0,
    "reconcile_interval_sec": 0.1,
    "sync_interval_sec": 5.0,  # longer than the measured window: only the promotion reaction counts
    "set_retry_interval_sec": 1.0,
    "rpc_timeout_sec": 2.0,
}


async def readiness(address: str) -> cpb.GetReadinessResponse | None:
    async with open_channel(address) as ch:
        try:
            resp: cpb.GetReadinessResponse = await cgrpc.DispatchServiceStub(ch).GetReadiness(
                cpb.GetReadinessRequest(), timeout=0.3)
            return resp
        except grpc.aio.AioRpcError:
            return None


async def is_master(address: str) -> bool:
    """Master in its own view (not "ready": a coordinator without instances is never ready)."""
    v = await readiness(address)
    return v is not None and v.role == cpb.COORDINATOR_ROLE_MASTER


async def coordinator_ids(address: str) -> set[int]:
    async with open_channel(address) as ch:
        resp = await cgrpc.InstanceRegistryServiceStub(ch).ListInstances(
            cpb.ListInstancesRequest(page_size=1000), metadata=call_metadata(KEY), timeout=0.5)
        return {i.id for i in resp.instances}


async def controller_active_ids(address: str) -> set[int]:
    async with open_channel(address) as ch:
        resp = await pbgrpc.ControllerAdminServiceStub(ch).ListInstances(
            pb.ListInstancesRequest(), metadata=call_metadata(KEY), timeout=1)
        return {m.instance.id for m in resp.instances if m.state == pb.INSTANCE_STATE_ACTIVE}


async def test_new_master_gets_the_full_instance_set_at_its_own_address_soon_after_promotion(tmp_path: Path) -> None:
    async with AsyncExitStack() as es:
        etcd = await es.enter_async_context(etcd_server())
        ctl = await es.enter_async_context(start_controller(tmp_path, CONTROLLER, management_key=KEY))
        ha = {"master_lock_ttl": 2, "master_standby_check_interval": 0.25, "controller_address": ctl.address,
              # the controller learns of these coordinators only from their promotion, so they are never
              # synced before it: campaign at once (docs/ha.md)
              "ha": {"etcd_endpoints": [etcd.endpoint], "election_key": "/motor/promo-test/leader",
                     "unsynced_campaign_delay_sec": 0}}
        coords = [await es.enter_async_context(start_coordinator(tmp_path, ha, management_key=KEY, name=n))
                  for n in ("coord-a", "coord-b")]
        nms = [await FakeNodeManager(f"{job}-n0", job, 0, 1, ctl.address, role=role).start()
               for job, role in (("job-p", tpb.ROLE_PREFILL), ("job-d", tpb.ROLE_DECODE))]
        for nm in nms:
            es.push_async_callback(nm.close)
        try:
            ids = await wait_for(lambda: _two_active(ctl.address), timeout=15, what="2 ACTIVE instances")
            old = await wait_for(lambda: _master_of(coords), timeout=10, what="a master")
            assert old is not None
            new = next(c for c in coords if c is not old)
            await wait_for(lambda: _has(old.address, ids), timeout=10, what="the first master holds the set")

            os.kill(old.pid, signal.SIGSTOP)
            frozen = time.monotonic()
            await wait_for(lambda: is_master(new.address), timeout=15, interval=0.02, what="the standby promoted")
            promoted = time.monotonic()
            await wait_for(lambda: _has(new.address, ids), timeout=5, interval=0.02, what="the new master holds the set")
            synced = time.monotonic()
            print(f"\n[promotion] freeze -> master {promoted - frozen:.2f}s; master -> full set {synced - promoted:.2f}s")
            assert synced - promoted < 2.0
            added = [line for line in ctl.log().splitlines() if "coordinator target added on promotion" in line]
            assert len(added) == 2, added  # both masters were unknown targets: pushed only on promotion
            assert ctl.alive()
        finally:
            for c in coords:
                if c.alive():
                    os.kill(c.pid, signal.SIGCONT)


async def _two_active(address: str) -> set[int]:
    ids = await controller_active_ids(address)
    return ids if len(ids) == 2 else set()


async def _master_of(coords: list[Proc]) -> Proc | None:
    for c in coords:
        if await is_master(c.address):
            return c
    return None


async def _has(address: str, ids: set[int]) -> bool:
    return await coordinator_ids(address) == ids
