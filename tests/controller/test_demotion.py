"""A controller that stops acting (lost or isolated election) stops pushing and reconciling at once,
even while its fault manager is still closing (a fire-and-forget abort in flight gets a grace).
Real Controller and pusher, in-memory store and coordinator."""

from __future__ import annotations

import asyncio

from motor_controller.config import ControllerConfig
from motor_controller.controller import Controller
from motor_controller.model import InstanceState, ManagedInstance
from motor_controller.store import MemoryStore
from tests.controller.test_push_targets import NoNodeManagers
from tests.controller.test_pusher import MemoryCoordinator, inst
from tests.helpers import wait_for


def active(iid: int) -> ManagedInstance:
    return ManagedInstance(id=iid, job_name=f"j{iid}", incarnation=0, state=InstanceState.ACTIVE, instance=inst(iid),
                           node_ids=(f"n{iid}",), master_address="", state_changed_at=0.0)


async def test_a_pausing_controller_neither_pushes_nor_reconciles_while_its_fault_manager_closes() -> None:
    coord = MemoryCoordinator()
    ctl = Controller(ControllerConfig(coordinators=[coord.address]), MemoryStore(), NoNodeManagers(),  # type: ignore[arg-type]
                     [coord])
    rounds = 0

    async def counted() -> None:  # counts the loop's rounds; the instances here have no nodes to plan with
        nonlocal rounds
        rounds += 1

    ctl.reconcile_once = counted  # type: ignore[method-assign]
    await ctl.load()
    ctl.instances[1] = active(1)
    ctl.start()
    await wait_for(lambda: sorted(coord.instances) == [1] and rounds > 0, what="acting: instance 1 pushed")
    abort_done = asyncio.Event()
    ctl.fault_manager._spawn_abort(abort_done.wait())  # an abort RPC to a slow nodemanager, in flight
    pausing = asyncio.create_task(ctl.pause())
    try:
        await wait_for(lambda: not ctl.acting, what="pause() started")
        sent, seen = len(coord.calls), rounds
        ctl.instances[7] = active(7)  # the desired view changes meanwhile (a result that was in flight)
        ctl._after_change()
        ctl.poke()
        await pausing  # the abort's grace runs out meanwhile
        assert coord.calls[sent:] == [] and sorted(coord.instances) == [1]
        assert rounds == seen
    finally:
        abort_done.set()
        await pausing
        await ctl.close()
