"""ControllerLeader: no lease renewal runs while a promoted controller loads its state, so it acts
only if the election still says it is master once the load is done; a load that fails for a reason
other than the store's reachability hands the lock over. Real Controller, in-memory
store, the election's view given directly (no etcd)."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from motor_common import leadership as lship
from motor_common.errors import Unavailable
from motor_common.etcd_election import StepDown
from motor_common.leadership import Leadership
from motor_controller.alarms import AlarmKind
from motor_controller.codec import KEYS
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


async def test_a_load_that_fails_for_a_reason_other_than_the_store_hands_the_lock_over_and_says_why() -> None:
    """An undecodable instance record: the promoted controller does not act, raises STATE_LOAD_FAILED
    naming the key, steps down (StepDown: the election revokes the lease), leaves a free lock to the
    others for 2 s, then 4 s; its readiness says why. Once the record is repaired, the next load
    acts and the failure is forgotten."""
    store = MemoryStore()
    await store.put(f"{KEYS.INSTANCE}6", orjson.dumps({"id": 6, "state": "draining"}))
    ctl = Controller(ControllerConfig(), store, NoNodeManagers())  # type: ignore[arg-type]
    health = Health()
    leader = ControllerLeader(ctl, health, "controller@a:1")
    now = [100.0]
    leader._mono = lambda: now[0]
    acquired = lship.acquired(lship.initial_candidate(), "a")
    try:
        with pytest.raises(StepDown):
            await leader.on_change(acquired)
        assert not ctl.acting and health.serving == [] and leader.promotions == 0
        [alarm] = [a for a in ctl.alarms.active() if a.kind is AlarmKind.STATE_LOAD_FAILED]
        assert alarm.source == "controller@a:1" and "'instances/6'" in alarm.message
        ready, why = leader.readiness()
        assert not ready and why.startswith("cannot load the controller state: ") and "'instances/6'" in why
        assert "trying again in 2 s" in (leader.may_acquire() or "")
        now[0] += 2.1
        assert leader.may_acquire() is None

        await leader.on_change(lship.lost(acquired))  # the election published the lost view
        with pytest.raises(StepDown):  # second failure in a row: 4 s
            await leader.on_change(lship.acquired(lship.lost(acquired), "a"))
        assert "trying again in 4 s" in (leader.may_acquire() or "")

        await store.delete(f"{KEYS.INSTANCE}6")  # repaired
        now[0] += 4.1
        await leader.on_change(lship.lost(acquired))
        await leader.on_change(lship.acquired(lship.lost(acquired), "a"))
        assert ctl.acting and health.serving == [True] and leader.readiness() == (True, "ok")
        assert leader.may_acquire() is None and leader.load_failures == 0
        assert not [a for a in ctl.alarms.active() if a.kind is AlarmKind.STATE_LOAD_FAILED]
    finally:
        await ctl.close()


async def test_a_load_that_cannot_reach_the_store_is_left_to_the_election_to_retry() -> None:
    """STORE_UNAVAILABLE during the load is connectivity, not an unreadable state: it propagates
    as is (the election isolates this master and retries), no step-down, no STATE_LOAD_FAILED."""
    ctl = Controller(ControllerConfig(), MemoryStore(), NoNodeManagers())  # type: ignore[arg-type]
    leader = ControllerLeader(ctl, Health(), "controller@a:1")

    async def unreachable() -> None:
        raise Unavailable("etcd store unavailable (timeout)", reason="STORE_UNAVAILABLE")

    ctl.load = unreachable  # type: ignore[method-assign]
    try:
        with pytest.raises(Unavailable):
            await leader.on_change(lship.acquired(lship.initial_candidate(), "a"))
        assert leader.load_failure == "" and leader.may_acquire() is None
        assert not [a for a in ctl.alarms.active() if a.kind is AlarmKind.STATE_LOAD_FAILED]
    finally:
        await ctl.close()
