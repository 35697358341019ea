"""Static stability on the controller: an instance whose node is lost stays in the coordinators'
routing for ``node_lost_routing_grace_sec`` (its engines may still serve; the coordinators judge
them), and leaves it once the grace is over, pushed within a reconcile tick of the deadline. The
real Controller (its reconcile loop and pusher) with injected clocks, an in-memory coordinator and
store."""

from __future__ import annotations

import logging
import math

import pytest

from motor_common.domain import EndpointStatus as ES
from motor_common.domain import InstanceStatus
from motor_controller.assembly import instance_id_for
from motor_controller.config import ControllerConfig
from motor_controller.controller import Controller
from motor_controller.metrics import ControllerCollector
from motor_controller.model import InstanceState
from motor_controller.push_plan import fingerprint
from motor_controller.store import MemoryStore
from tests.controller.factories import obs, record, spec
from tests.controller.test_push_targets import NoNodeManagers
from tests.controller.test_pusher import MemoryCoordinator
from tests.helpers import wait_for

IID = instance_id_for("job-p", 0)
NODE = "job-p-n0"


def test_the_grace_defaults_to_300_s_and_is_validated() -> None:
    assert ControllerConfig().node_lost_routing_grace_sec == 300.0
    for ok in (0.0, 0.5, 86400.0):
        assert ControllerConfig(node_lost_routing_grace_sec=ok).node_lost_routing_grace_sec == ok
    for bad in (-1.0, 86400.5, math.nan, math.inf):
        with pytest.raises(ValueError, match=r"node_lost_routing_grace_sec must be in \[0, 86400\]"):
            ControllerConfig(node_lost_routing_grace_sec=bad)


class Clocks:
    def __init__(self) -> None:
        self.mono, self.wall = 100.0, 5000.0


def routed_without_node(ctl: Controller) -> float:
    gauge = next(m for m in ControllerCollector(ctl).collect() if m.name == "motor_controller_instances_routed_without_node")
    return gauge.samples[0].value


async def test_a_lost_node_keeps_its_instance_routed_for_the_grace_then_the_push_removes_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clocks = Clocks()
    coordinator = MemoryCoordinator()
    config = ControllerConfig(coordinators=[coordinator.address], reconcile_interval_sec=0.05,
                              node_lost_routing_grace_sec=60.0)
    ctl = Controller(config, MemoryStore(), NoNodeManagers(), [coordinator],  # type: ignore[arg-type]
                     clock=lambda: clocks.mono, wall=lambda: clocks.wall)
    pusher = ctl.pushers[0]

    def in_sync() -> bool:
        return pusher.state.fingerprint == fingerprint(ctl.desired_view())

    def coordinator_has() -> dict[int, InstanceStatus]:
        return {i: v.status for i, v in coordinator.instances.items()}

    caplog.set_level(logging.INFO, logger="motor_controller.controller")
    try:
        ctl.nodes[NODE] = record(spec(0, 1), registered_mono=clocks.mono)
        ctl.observations[NODE] = obs(clocks.mono, IID, [ES.NORMAL, ES.NORMAL])
        ctl.start()
        await wait_for(lambda: coordinator_has() == {IID: InstanceStatus.AVAILABLE}, timeout=10, what="ACTIVE pushed")
        assert ctl.instances[IID].state is InstanceState.ACTIVE and routed_without_node(ctl) == 0.0

        clocks.mono += 5.0  # the node's heartbeats stop: lost after the 3 s timeout
        await wait_for(lambda: ctl.instances[IID].state is InstanceState.INACTIVE, timeout=10, what="INACTIVE")
        mi = ctl.instances[IID]
        assert mi.routable_until == 5060.0 and NODE in mi.reason
        await wait_for(in_sync, timeout=10, what="the pusher in sync with the desired view")
        assert coordinator_has() == {IID: InstanceStatus.AVAILABLE}  # kept: no DEL
        assert routed_without_node(ctl) == 1.0
        kept = [r for r in caplog.records if "kept in routing with its node" in r.getMessage()]
        assert len(kept) == 1 and kept[0].levelno == logging.WARNING
        assert all(s in kept[0].getMessage() for s in (str(IID), NODE, "1970-01-01T01:24:20"))  # 5060 s, UTC

        clocks.wall += 59.0  # within the grace: still kept, nothing logged again
        await wait_for(in_sync, timeout=10, what="the pusher in sync")
        assert coordinator_has() == {IID: InstanceStatus.AVAILABLE}
        clocks.wall += 1.0  # the deadline: the next reconcile tick re-plans the push, the DEL follows
        # (the pusher's own periodic check waits 5 s — sync_interval_sec — in real time: only the
        # re-plan on the reconcile tick makes it within 2 s)
        await wait_for(lambda: coordinator_has() == {}, timeout=2, what="the DEL once the grace is over")
        assert ctl.instances[IID].state is InstanceState.INACTIVE and routed_without_node(ctl) == 0.0
        assert len([r for r in caplog.records if "kept in routing with its node" in r.getMessage()]) == 1
        assert any("no longer kept in routing" in r.getMessage() and "grace" in r.getMessage() for r in caplog.records)

        # the node comes back (its nodemanager re-adopted the engines): ACTIVE again, the same id
        ctl.observations[NODE] = obs(clocks.mono, IID, [ES.NORMAL, ES.NORMAL])
        await wait_for(lambda: coordinator_has() == {IID: InstanceStatus.AVAILABLE}, timeout=10, what="back")
        assert ctl.instances[IID].state is InstanceState.ACTIVE and ctl.instances[IID].routable_until == 0.0
    finally:
        await ctl.close()


async def test_a_lost_node_that_comes_back_abnormal_takes_its_instance_out_at_once() -> None:
    clocks = Clocks()
    coordinator = MemoryCoordinator()
    config = ControllerConfig(coordinators=[coordinator.address], reconcile_interval_sec=0.05)
    ctl = Controller(config, MemoryStore(), NoNodeManagers(), [coordinator],  # type: ignore[arg-type]
                     clock=lambda: clocks.mono, wall=lambda: clocks.wall)
    try:
        ctl.nodes[NODE] = record(spec(0, 1), registered_mono=clocks.mono)
        ctl.observations[NODE] = obs(clocks.mono, IID, [ES.NORMAL, ES.NORMAL])
        ctl.start()
        await wait_for(lambda: IID in coordinator.instances, timeout=10, what="ACTIVE pushed")
        clocks.mono += 5.0
        await wait_for(lambda: ctl.instances[IID].routable_until == 5300.0, timeout=10, what="kept (default 300 s)")
        ctl.observations[NODE] = obs(clocks.mono, IID, [ES.ABNORMAL, ES.NORMAL])
        await wait_for(lambda: coordinator.instances == {}, timeout=5, what="the DEL once its engines are ABNORMAL")
        assert ctl.instances[IID].state is InstanceState.INACTIVE and ctl.instances[IID].routable_until == 0.0
    finally:
        await ctl.close()
