"""ControllerLeader: no lease renewal runs while a promoted controller loads its state, so it acts
only if the election still says it is master once the load is done. Real Controller, in-memory
store, the election's view given directly (no etcd)."""

from __future__ import annotations

from dataclasses import replace

from motor_common import leadership as lship
from motor_common.leadership import Leadership
from motor_controller.config import ControllerConfig
from motor_controller.controller import Controller
from motor_controller.election import ControllerLeader
from motor_controller.store import MemoryStore
from tests.controller.test_push_targets import NoNodeManagers


class Health:
    def __init__(self) -> None:
        self.serving: list[bool] = []

    async def set_serving(self, serving: bool, service: str | None = None) -> None:
        self.serving.append(serving)


async def test_a_controller_whose_lease_lapsed_during_its_load_does_not_act_until_a_renewal_confirms_it() -> None:
    ctl = Controller(ControllerConfig(), MemoryStore(), NoNodeManagers())  # type: ignore[arg-type]
    health = Health()
    leader = ControllerLeader(ctl, health, "controller@a:1")
    acquired = lship.acquired(lship.initial_candidate(), "a")
    now: Leadership = replace(acquired, isolated=True)  # the load outlasted the lease's safe window
    leader.current = lambda: now
    loads = 0
    load = ctl.load

    async def counted_load() -> None:
        nonlocal loads
        loads += 1
        await load()

    ctl.load = counted_load  # type: ignore[method-assign]
    try:
        await leader.on_change(acquired)
        assert loads == 1 and not ctl.acting and health.serving == [] and leader.promotions == 0

        # the next renewal: the election publishes the overdue view, then the renewed one
        now = lship.renew_ok(now)
        await leader.on_change(replace(acquired, isolated=True))
        await leader.on_change(now)
        assert loads == 2 and ctl.acting and health.serving == [True] and leader.promotions == 1
    finally:
        await ctl.close()
