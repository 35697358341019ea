"""Controller in-process + fake nodemanagers (real gRPC) + a real motor-coordinator process."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as pbgrpc
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_client import call_metadata, open_channel
from motor_controller.assembly import instance_id_for
from tests.controller.fakes import (
    KEY,
    FakeNodeManager,
    RunningController,
    controller_config,
    start_controller_inproc,
)
from tests.helpers import free_port, wait_for
from tests.procs import start_coordinator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

IID = instance_id_for("job-p", 0)


async def coordinator_ids(address: str) -> dict[int, int]:
    """id -> endpoint count as the coordinator lists them."""
    async with open_channel(address) as ch:
        resp = await cgrpc.InstanceRegistryServiceStub(ch).ListInstances(
            cpb.ListInstancesRequest(), metadata=call_metadata(KEY), timeout=2
        )
    return {i.id: len(i.endpoints) for i in resp.instances}


async def admin_instance(ctl: RunningController, iid: int) -> pb.ManagedInstance:
    async with open_channel(ctl.address) as ch:
        resp = await pbgrpc.ControllerAdminServiceStub(ch).GetInstance(
            pb.GetInstanceRequest(instance_id=iid), metadata=call_metadata(KEY), timeout=2
        )
    return resp.instance


async def nodes_for(ctl: RunningController, job: str = "job-p", n: int = 2) -> list[FakeNodeManager]:
    return [await FakeNodeManager(f"{job}-n{r}", job, r, n, ctl.address).start() for r in range(n)]


class Fleet:
    """An in-process controller with its fake nodemanagers; :meth:`restart` swaps the controller."""

    def __init__(self, ctl: RunningController, nms: list[FakeNodeManager]) -> None:
        self.ctl, self.nms = ctl, nms

    async def restart(self, config: Any) -> RunningController:
        """Stop the controller, start one on the same port with *config* (same store file)."""
        port = self.ctl.port
        await self.ctl.stop()
        self.ctl = await start_controller_inproc(config, port=port)
        return self.ctl


@asynccontextmanager
async def fleet(config: Any) -> AsyncIterator[Fleet]:
    ctl = await start_controller_inproc(config)
    f = Fleet(ctl, [])
    try:
        f.nms = await nodes_for(ctl)
        yield f
    finally:
        for nm in f.nms:
            await nm.close()
        await f.ctl.stop()


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[str]:
    port = free_port()
    async with start_coordinator(tmp_path / "coord", management_key=KEY, extra_args=["--port", str(port)]) as proc:
        yield proc.address


@pytest.mark.parametrize("grace", [0.0, 2.0])
async def test_nodes_assemble_start_go_active_and_reach_the_coordinator_then_leave_and_return(
    tmp_path: Path, coordinator: str, grace: float
) -> None:
    async with fleet(controller_config(tmp_path, [coordinator], node_lost_routing_grace_sec=grace)) as f:
        ctl, nms = f.ctl, f.nms
        await wait_for(lambda: all(nm.starts for nm in nms), timeout=10, what="StartEngines on every node")
        start1 = nms[1].starts[0]
        assert start1.instance_id == IID and [e.dp_rank for e in start1.endpoints] == [2, 3]
        assert (start1.node_rank, start1.num_nodes, start1.dp_size) == (1, 2, 4)
        assert start1.master_address == "127.0.0.1" and all(e.node_id == "job-p-n1" for e in start1.endpoints)
        await wait_for(lambda: ctl.controller.instances[IID].state.value == "active", timeout=10, what="ACTIVE")
        # the push follows the state change (asynchronously): wait for it, then check what arrived
        await wait_for(lambda: _has(coordinator, IID), timeout=5, what="instance pushed to the coordinator")
        assert (await coordinator_ids(coordinator)) == {IID: 4}

        # one node stops heartbeating: the instance goes INACTIVE within the timeout
        nms[1].heartbeating = False
        if grace == 0:  # node_lost_routing_grace_sec off: it leaves the coordinator at once
            # heartbeat timeout 0.6 s + one reconcile tick + one push, with slack for a loaded 2-core CI box
            await wait_for(lambda: _empty(coordinator), timeout=0.6 + 3.0, what="instance removed within the timeout")
        else:  # kept in routing (AVAILABLE) until the grace is over, then removed within a tick or two
            await wait_for(lambda: ctl.controller.instances[IID].state.value == "inactive", timeout=0.6 + 3.0,
                           what="INACTIVE within the timeout")
            until = ctl.controller.instances[IID].routable_until
            assert until > time.time()
            assert await coordinator_statuses(coordinator) == {IID: tpb.INSTANCE_STATUS_AVAILABLE}
            await wait_for(lambda: _empty(coordinator), timeout=grace + 3.0, what="instance removed after the grace")
            assert time.time() >= until  # not before the deadline
        mi = await admin_instance(ctl, IID)
        assert mi.state == pb.INSTANCE_STATE_INACTIVE and "job-p-n1" in mi.reason
        # it comes back: the instance returns
        nms[1].heartbeating = True
        await wait_for(lambda: _has(coordinator, IID), timeout=5, what="instance back")
        assert len(nms[0].starts) == 1  # the surviving node was never restarted


async def coordinator_statuses(address: str) -> dict[int, int]:
    async with open_channel(address) as ch:
        resp = await cgrpc.InstanceRegistryServiceStub(ch).ListInstances(
            cpb.ListInstancesRequest(), metadata=call_metadata(KEY), timeout=2
        )
    return {i.id: i.status for i in resp.instances}


async def _empty(address: str) -> bool:
    return (await coordinator_ids(address)) == {}


async def _has(address: str, iid: int) -> bool:
    return iid in await coordinator_ids(address)


async def test_restarted_coordinator_gets_the_instance_set_within_one_sync_period(tmp_path: Path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    async with fleet(controller_config(tmp_path, [address], sync_interval_sec=1.0)) as f:
        ctl = f.ctl
        async with start_coordinator(tmp_path / "c1", management_key=KEY, extra_args=["--port", str(port)]):
            await wait_for(lambda: _has(address, IID), timeout=10, what="instance on coordinator")
        # the coordinator is down; nothing changes meanwhile; then it comes back empty on the same port
        async with start_coordinator(tmp_path / "c2", management_key=KEY, extra_args=["--port", str(port)]):
            await wait_for(lambda: _has(address, IID), timeout=1.0 + 2.0, what="full SET after restart")
            assert set(await coordinator_ids(address)) == set(ctl.controller.desired_view())


async def test_restarted_controller_resumes_instances_without_restarting_healthy_engines(
    tmp_path: Path, coordinator: str
) -> None:
    config = controller_config(tmp_path, [coordinator])
    async with fleet(config) as f:
        nms = f.nms
        await wait_for(lambda: _has(coordinator, IID), timeout=10, what="instance on coordinator")
        ctl = await f.restart(config)
        assert ctl.controller.instances[IID].state.value == "active"
        await wait_for(lambda: all(nm.instance_id == IID for nm in nms), timeout=5)
        # heartbeats confirm the running instance; a few timeouts later still one start per node
        await wait_for(
            lambda: all(ctl.controller.observations.get(nm.node_id) for nm in nms), timeout=5, what="heartbeats"
        )
        await wait_for(lambda: ctl.controller.signals.get(IID) is not None
                       and ctl.controller.signals[IID].value == "healthy", timeout=5)
        assert ctl.controller.instances[IID].state.value == "active"
        assert [len(nm.starts) for nm in nms] == [1, 1]
        assert ctl.controller.starts_sent == []
        assert all(nm.reregister_commands == 0 for nm in nms)
        assert await _has(coordinator, IID)


async def test_terminate_stops_nodes_deletes_instance_and_clears_precision_alarms(
    tmp_path: Path, coordinator: str
) -> None:
    async with fleet(controller_config(tmp_path, [coordinator])) as f:
        ctl, nms = f.ctl, f.nms
        await wait_for(lambda: _has(coordinator, IID), timeout=10, what="instance on coordinator")
        async with open_channel(ctl.address) as ch:
            node = pbgrpc.ControllerServiceStub(ch)
            admin = pbgrpc.ControllerAdminServiceStub(ch)
            md = call_metadata(KEY)
            alarm = pb.Alarm(kind=pb.ALARM_KIND_PRECISION, action=pb.ALARM_ACTION_RAISE,
                             source="coordinator@x", instance_ids=[IID, 42])
            assert (await node.ReportAlarm(pb.ReportAlarmRequest(alarm=alarm), metadata=md, timeout=2)).accepted
            assert len((await admin.ListAlarms(pb.ListAlarmsRequest(active_only=True), metadata=md)).alarms) == 1
            resp = await admin.TerminateInstance(
                pb.TerminateInstanceRequest(instance_id=IID, precision_alarm_clear=True, reason="test"),
                metadata=md, timeout=5,
            )
            assert sorted(resp.stopped_node_ids) == ["job-p-n0", "job-p-n1"]
            assert all(nm.stops for nm in nms)
            assert (await admin.ListAlarms(pb.ListAlarmsRequest(active_only=True), metadata=md)).alarms == []
            mi = (await admin.GetInstance(pb.GetInstanceRequest(instance_id=IID), metadata=md)).instance
            assert mi.state == pb.INSTANCE_STATE_DELETED
        await wait_for(lambda: _empty(coordinator), timeout=5, what="DEL on coordinator")


@pytest.mark.parametrize("recovery", [True, False])
async def test_precision_alarm_auto_recovery_terminates_the_group_and_clears_with_the_raise_identity(
    tmp_path: Path, coordinator: str, recovery: bool
) -> None:
    from motor_controller.config import FaultToleranceConfig

    ft = FaultToleranceConfig(enable_fault_tolerance=True, enable_precision_recovery=recovery)
    async with fleet(controller_config(tmp_path, [coordinator], fault_tolerance_config=ft)) as f:
        ctl, nms = f.ctl, f.nms
        await wait_for(lambda: _has(coordinator, IID), timeout=10, what="instance on coordinator")
        async with open_channel(ctl.address) as ch:
            node = pbgrpc.ControllerServiceStub(ch)
            admin = pbgrpc.ControllerAdminServiceStub(ch)
            md = call_metadata(KEY)
            alarm = pb.Alarm(kind=pb.ALARM_KIND_PRECISION, action=pb.ALARM_ACTION_RAISE,
                             source="coordinator@x", instance_ids=[42, IID])
            assert (await node.ReportAlarm(pb.ReportAlarmRequest(alarm=alarm), metadata=md, timeout=2)).accepted

            async def alarms(active_only: bool) -> list[pb.Alarm]:
                resp = await admin.ListAlarms(pb.ListAlarmsRequest(active_only=active_only), metadata=md, timeout=2)
                return list(resp.alarms)

            if not recovery:
                await wait_for(lambda: _has(coordinator, IID), timeout=2, what="instance still there")
                assert len(await alarms(True)) == 1 and not any(nm.stops for nm in nms)
                return
            await wait_for(lambda: all(nm.stops for nm in nms), timeout=5, what="the group's nodes stopped")

            async def cleared_only() -> list[pb.Alarm]:
                got = await alarms(False)
                return got if got and all(a.action == pb.ALARM_ACTION_CLEAR for a in got) else []

            cleared = await wait_for(cleared_only, timeout=5, what="the CLEAR")
            assert [(a.action, a.source, sorted(a.instance_ids)) for a in cleared] == [
                (pb.ALARM_ACTION_CLEAR, "coordinator@x", sorted([42, IID]))
            ]
            assert await alarms(True) == []
            mi = (await admin.GetInstance(pb.GetInstanceRequest(instance_id=IID), metadata=md)).instance
            assert mi.state == pb.INSTANCE_STATE_DELETED
        await wait_for(lambda: _empty(coordinator), timeout=5, what="DEL on coordinator")


async def test_a_restarted_controller_resumes_the_auto_recovery_of_an_active_precision_alarm(
    tmp_path: Path, coordinator: str
) -> None:
    """The alarm is raised while recovery is off (as if the controller died before acting on it);
    the controller restarts on the same store with recovery on: it terminates the group and
    records the CLEAR with the raise's identity, without a new RAISE."""
    from dataclasses import replace

    from motor_controller.config import FaultToleranceConfig

    off = FaultToleranceConfig(enable_fault_tolerance=True, enable_precision_recovery=False)
    config = controller_config(tmp_path, [coordinator], fault_tolerance_config=off)
    md = call_metadata(KEY)
    async with fleet(config) as f:
        ctl, nms = f.ctl, f.nms
        await wait_for(lambda: _has(coordinator, IID), timeout=10, what="instance on coordinator")
        async with open_channel(ctl.address) as ch:
            alarm = pb.Alarm(kind=pb.ALARM_KIND_PRECISION, action=pb.ALARM_ACTION_RAISE,
                             source="coordinator@x", instance_ids=[IID, 42])  # fmt: skip
            req = pb.ReportAlarmRequest(alarm=alarm)
            assert (await pbgrpc.ControllerServiceStub(ch).ReportAlarm(req, metadata=md, timeout=2)).accepted
        assert not any(nm.stops for nm in nms)

        on = replace(off, enable_precision_recovery=True)
        ctl = await f.restart(replace(config, fault_tolerance_config=on))
        await wait_for(lambda: all(nm.stops for nm in nms), timeout=10, what="the group's nodes stopped")
        async with open_channel(ctl.address) as ch:
            admin = pbgrpc.ControllerAdminServiceStub(ch)

            async def history() -> list[pb.Alarm]:
                resp = await admin.ListAlarms(pb.ListAlarmsRequest(), metadata=md, timeout=2)
                got = list(resp.alarms)
                return got if got and all(a.action == pb.ALARM_ACTION_CLEAR for a in got) else []

            cleared = await wait_for(history, timeout=5, what="the CLEAR after the restart")
            assert [(a.source, sorted(a.instance_ids)) for a in cleared] == [("coordinator@x", sorted([42, IID]))]
            mi = (await admin.GetInstance(pb.GetInstanceRequest(instance_id=IID), metadata=md, timeout=2)).instance
            assert mi.state == pb.INSTANCE_STATE_DELETED


async def test_a_controller_on_an_empty_store_takes_nothing_from_a_serving_coordinator_until_its_grace_ends(
    tmp_path: Path, coordinator: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A lost store (SQLite file gone, etcd data lost, a new etcd prefix) must not empty the
    coordinators: the new controller keeps what they hold until the fleet could re-attach."""
    for sub in ("first", "fresh"):
        (tmp_path / sub).mkdir()
    async with fleet(controller_config(tmp_path / "first", [coordinator])) as f:
        await wait_for(lambda: _has(coordinator, IID), timeout=15, what="instance pushed to the coordinator")
        for nm in f.nms:  # the nodes stay away (they will not re-attach to the next controller)
            await nm.close()
        f.nms = []
        await f.ctl.stop()
        fresh = controller_config(tmp_path / "fresh", [coordinator], reattach_grace_sec=8.0)
        f.ctl = await start_controller_inproc(fresh, port=f.ctl.port)
        ctl = f.ctl.controller
        assert ctl.instances == {}  # nothing of the first controller's history
        (pusher,) = ctl.pushers
        await wait_for(lambda: pusher.pushes.get("set", 0) >= 1, timeout=5, what="the new controller's first SET")
        assert ctl._clock() < ctl.reattach_until, "the first push must fall inside the grace"
        assert await coordinator_ids(coordinator) == {IID: 4}  # still served
        assert "has no record of" in caplog.text
        # the grace ends and nobody re-attached: now the controller's view wins
        await wait_for(lambda: _empty(coordinator), timeout=8.0 + 5.0, what="unknown instance removed after the grace")
