"""Which coordinators a controller pushes to (with the management key): its configured ones and at
most one master announced in the current term. In-memory coordinators and store, real Controller."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import orjson
import pytest

from motor_common.errors import ResourceExhausted, Unavailable
from motor_controller import codec
from motor_controller import controller as controller_module
from motor_controller.alarms import Alarm, AlarmAction, AlarmKind
from motor_controller.codec import KEYS
from motor_controller.config import ControllerConfig
from motor_controller.controller import Controller
from motor_controller.store import MemoryStore
from tests.controller.test_pusher import MemoryCoordinator


class Coord(MemoryCoordinator):
    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address
        self.closed = False

    async def close(self) -> None:
        self.closed = True


class NoNodeManagers:
    async def close(self) -> None:
        return None


def controller(store: MemoryStore, made: dict[str, Coord]) -> Controller:
    def factory(address: str) -> Coord:
        made[address] = Coord(address)
        return made[address]

    made["conf:1"] = Coord("conf:1")
    return Controller(ControllerConfig(coordinators=["conf:1"]), store, NoNodeManagers(),  # type: ignore[arg-type]
                      [made["conf:1"]], coordinator_factory=factory)


def targets(ctl: Controller) -> list[str]:
    return sorted(p.client.address for p in ctl.pushers)


async def test_a_new_announced_master_replaces_the_previous_one_and_stale_addresses_are_dropped() -> None:
    store = MemoryStore()
    for address in ("old-run:1", "conf:1"):  # generations persisted by earlier runs
        await store.put(f"{KEYS.COORDINATOR}{address}", orjson.dumps({"generation": 7}))
    made: dict[str, Any] = {}
    ctl = controller(store, made)
    await ctl.load()
    assert targets(ctl) == ["conf:1"]
    assert [k for k, _ in await store.list(KEYS.COORDINATOR)] == [f"{KEYS.COORDINATOR}conf:1"]
    assert ctl.pushers[0].state.generation == 7  # the configured one keeps its generation

    await ctl.on_coordinator_promoted("pod-a:1")
    assert targets(ctl) == ["conf:1", "pod-a:1"]
    await ctl.on_coordinator_promoted("pod-a:1")  # repeated announcement: no duplicate
    assert targets(ctl) == ["conf:1", "pod-a:1"]
    await store.put(f"{KEYS.COORDINATOR}pod-a:1", orjson.dumps({"generation": 3}))
    await ctl.on_coordinator_promoted("pod-b:1")  # a newer master: the previous one is dropped for good
    assert targets(ctl) == ["conf:1", "pod-b:1"] and made["pod-a:1"].closed
    assert await store.get(f"{KEYS.COORDINATOR}pod-a:1") is None
    await ctl.on_coordinator_promoted("pod-c:1")
    await ctl.pause()  # lost the election; a later term starts from the configuration only
    await ctl.load()
    assert targets(ctl) == ["conf:1"] and made["pod-c:1"].closed and ctl.announced_master is None
    await ctl.on_coordinator_promoted("pod-d:1")
    await ctl.on_coordinator_promoted("conf:1")  # a configured coordinator won: pod-d's term is over
    assert targets(ctl) == ["conf:1"] and made["pod-d:1"].closed
    await ctl.close()


def promoted(address: str) -> Alarm:
    return Alarm(AlarmKind.COORDINATOR_PROMOTED, AlarmAction.RAISE, f"coordinator@{address}", (), address=address)


async def test_an_announcement_no_configured_coordinator_confirms_changes_nothing() -> None:
    """ReportAlarm needs only a node key, which every nodemanager holds, and push targets receive
    the operator key: an address is a target only when a configured coordinator, asked at its
    configured address, says it is master there."""
    store = MemoryStore()
    made: dict[str, Any] = {}
    ctl = controller(store, made)
    await ctl.load()
    conf = made["conf:1"]
    epoch = conf.epoch
    for master_at in (None, "pod-a:1"):  # not master / master, but elsewhere
        conf.master_at = master_at
        with pytest.raises(Unavailable) as err:
            await ctl.report_alarm(promoted("attacker:443"))
        assert err.value.reason == "PROMOTION_NOT_CONFIRMED"
    assert targets(ctl) == ["conf:1"] and "attacker:443" not in made
    assert ctl.alarms.entries(active_only=True) == [] and await store.list(KEYS.ALARM) == []
    assert conf.epoch == epoch  # no reconnect either
    conf.down = True
    with pytest.raises(Unavailable):
        await ctl.report_alarm(promoted("pod-a:1"))
    await ctl.close()


async def test_a_confirmed_announcement_adds_the_master_as_a_target() -> None:
    store = MemoryStore()
    made: dict[str, Any] = {}
    ctl = controller(store, made)
    await ctl.load()
    made["conf:1"].master_at = "10.1.2.3:9100"  # the Service-like configured name reaches the pod
    assert await ctl.report_alarm(promoted("10.1.2.3:9100"))
    assert targets(ctl) == ["10.1.2.3:9100", "conf:1"]
    assert [a.address for a in ctl.alarms.entries(active_only=True)] == ["10.1.2.3:9100"]
    made["conf:1"].master_at = "conf:1"  # a configured coordinator announcing itself
    assert await ctl.report_alarm(promoted("conf:1"))
    assert targets(ctl) == ["conf:1"]
    await ctl.close()


class Frozen(Coord):
    """A configured coordinator that accepts the connection and never answers (SIGSTOP)."""

    async def master_address(self) -> str | None:
        await asyncio.Event().wait()
        return None


async def test_a_frozen_configured_coordinator_does_not_hold_up_its_successors_confirmation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made: dict[str, Any] = {}
    frozen, live = Frozen("old:1"), Coord("new:1")
    live.master_at = "new:1"
    ctl = Controller(ControllerConfig(coordinators=["old:1", "new:1"]), MemoryStore(), NoNodeManagers(),  # type: ignore[arg-type]
                     [frozen, live], coordinator_factory=lambda a: made.setdefault(a, Coord(a)))
    await ctl.load()
    # The first confirmation decides: waiting for every answer would wait out the frozen one (an hour here).
    monkeypatch.setattr(controller_module, "PROMOTION_CHECK_SEC", 3600.0)
    assert await asyncio.wait_for(ctl.promotion_confirmed("new:1"), 30)
    # Nobody confirms: the answer is no once the wait is over (the frozen one never answers).
    monkeypatch.setattr(controller_module, "PROMOTION_CHECK_SEC", 0.1)
    assert not await ctl.promotion_confirmed("elsewhere:1")
    await ctl.close()


async def test_alarms_are_bounded_and_a_new_promotion_clears_the_previous_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every active alarm is persisted and reloaded at start-up: a peer raising alarms under ever
    new sources must meet a limit (RESOURCE_EXHAUSTED, nothing stored), and promotions, never
    cleared by their coordinators, end when a newer one arrives."""
    monkeypatch.setattr(controller_module, "MAX_ACTIVE_ALARMS", 3)
    store = MemoryStore()
    made: dict[str, Any] = {}
    ctl = controller(store, made)
    await ctl.load()
    for master in ("pod-a:1", "pod-b:1"):
        made["conf:1"].master_at = master
        assert await ctl.report_alarm(promoted(master))
    active = ctl.alarms.entries(active_only=True)
    assert [a.address for a in active] == ["pod-b:1"]
    assert [k for k, _ in await store.list(KEYS.ALARM)] == [codec.alarm_store_key(active[0])]
    assert [a.message for a in ctl.alarms.entries() if a.action is AlarmAction.CLEAR] == ["superseded by pod-b:1"]

    def store_down(source: str) -> Alarm:
        return Alarm(AlarmKind.STORE_UNAVAILABLE, AlarmAction.RAISE, source, ())

    assert await ctl.report_alarm(store_down("x1")) and await ctl.report_alarm(store_down("x2"))
    with pytest.raises(ResourceExhausted) as err:  # a fourth identity
        await ctl.report_alarm(store_down("x3"))
    assert err.value.reason == "TOO_MANY_ALARMS"
    assert len(ctl.alarms) == 3 and len(await store.list(KEYS.ALARM)) == 3
    assert await ctl.report_alarm(store_down("x1"))  # an active one again: fine
    assert await ctl.report_alarm(replace(store_down("x1"), action=AlarmAction.CLEAR))
    assert await ctl.report_alarm(store_down("x3"))  # room again
    await ctl.close()


async def test_without_configured_coordinators_an_announcement_is_the_only_way_and_is_taken(
        caplog: pytest.LogCaptureFixture) -> None:
    made: dict[str, Any] = {}
    with caplog.at_level("WARNING", logger="motor_controller.controller"):
        ctl = Controller(ControllerConfig(), MemoryStore(), NoNodeManagers(),  # type: ignore[arg-type]
                         [], coordinator_factory=lambda a: made.setdefault(a, Coord(a)))
    assert any("no coordinators configured" in r.getMessage() for r in caplog.records)
    await ctl.load()
    assert await ctl.report_alarm(promoted("pod-a:1"))
    assert targets(ctl) == ["pod-a:1"]
    await ctl.close()
