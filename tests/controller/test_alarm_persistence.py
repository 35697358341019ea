"""An alarm change the store rejects changes nothing: its retry does the whole change (persist,
recovery, notification). Real Controller, an in-memory store that fails chosen writes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from motor_common.errors import Unavailable
from motor_controller.alarms import Alarm, AlarmAction, AlarmKind
from motor_controller.config import ControllerConfig, FaultToleranceConfig
from motor_controller.controller import Controller
from motor_controller.store import MemoryStore
from tests.controller.test_push_targets import NoNodeManagers

RAISE = Alarm(AlarmKind.PRECISION, AlarmAction.RAISE, "coordinator@c:1", (11, 22), "c:1", "wrong answer", 1.0)
CLEAR = Alarm(AlarmKind.PRECISION, AlarmAction.CLEAR, "coordinator@c:1", (11, 22), "c:1", "ok again", 2.0)
KEY = "alarms/precision/coordinator@c:1/11,22"


class FailingStore(MemoryStore):
    """Fails the next ``fail`` writes with STORE_UNAVAILABLE (an etcd timeout, a full disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = 0

    async def batch(self, puts: Mapping[str, bytes], deletes: Sequence[str] = ()) -> None:
        if self.fail:
            self.fail -= 1
            raise Unavailable("etcd store unavailable (timeout)", reason="STORE_UNAVAILABLE")
        await super().batch(puts, deletes)

    async def put(self, key: str, value: bytes) -> None:
        await self.batch({key: value})

    async def delete(self, key: str) -> None:
        await self.batch({}, [key])


async def controller(store: FailingStore) -> tuple[Controller, list[Alarm], list[tuple[int, ...]]]:
    ft = FaultToleranceConfig(enable_fault_tolerance=True, enable_precision_recovery=True)
    ctl = Controller(ControllerConfig(fault_tolerance_config=ft), store, NoNodeManagers())  # type: ignore[arg-type]
    await ctl.load()
    notified: list[Alarm] = []
    ctl.on_alarm = notified.append
    recoveries: list[tuple[int, ...]] = []

    def start_recovery(alarm: Alarm) -> bool:  # observed, not run (it would terminate instances)
        recoveries.append(alarm.key[2])
        return True

    ctl._start_precision_recovery = start_recovery  # type: ignore[method-assign]
    return ctl, notified, recoveries


async def test_a_raise_the_store_rejects_changes_nothing_and_its_retry_starts_recovery_and_notifies() -> None:
    store = FailingStore()
    ctl, notified, recoveries = await controller(store)
    store.fail = 1
    with pytest.raises(Unavailable):
        await ctl.report_alarm(RAISE)
    assert not ctl.alarms.is_active(RAISE) and KEY not in store.data
    assert notified == [] and recoveries == []

    assert await ctl.report_alarm(RAISE)  # the coordinator's outbox retries
    assert ctl.alarms.is_active(RAISE) and KEY in store.data
    assert [a.action for a in notified] == [AlarmAction.RAISE]
    assert recoveries == [(11, 22)]
    await ctl.close()


async def test_a_clear_the_store_rejects_keeps_the_alarm_and_its_retry_deletes_the_record() -> None:
    store = FailingStore()
    ctl, notified, _ = await controller(store)
    assert await ctl.report_alarm(RAISE)
    store.fail = 1
    with pytest.raises(Unavailable):
        await ctl.report_alarm(CLEAR)
    assert ctl.alarms.is_active(RAISE) and KEY in store.data

    assert await ctl.report_alarm(CLEAR)
    assert not ctl.alarms.is_active(RAISE) and KEY not in store.data
    assert [a.action for a in notified] == [AlarmAction.RAISE, AlarmAction.CLEAR]
    await ctl.close()

    restarted, _, _ = await controller(store)  # the alarm does not come back with a restart
    assert restarted.alarms.active() == []
    await restarted.close()


async def test_a_terminate_whose_alarm_delete_fails_clears_the_alarm_when_retried() -> None:
    store = FailingStore()
    ctl, notified, _ = await controller(store)
    assert await ctl.report_alarm(RAISE)
    store.fail = 1
    with pytest.raises(Unavailable):
        await ctl._clear_precision(11)
    assert ctl.alarms.is_active(RAISE) and KEY in store.data

    await ctl._clear_precision(11)  # TerminateInstance(precision_alarm_clear) retried
    assert not ctl.alarms.is_active(RAISE) and KEY not in store.data
    assert [a.action for a in notified] == [AlarmAction.RAISE, AlarmAction.CLEAR]
    await ctl.close()
