from __future__ import annotations

from motor_controller.alarms import Alarm, AlarmAction, AlarmKind, AlarmStore


def precision(ids: tuple[int, ...], action: AlarmAction = AlarmAction.RAISE, source: str = "coord@a") -> Alarm:
    return Alarm(AlarmKind.PRECISION, action, source, ids, raised_at=1.0)


def test_raise_is_indexed_per_pd_group_and_clear_uses_the_same_identity() -> None:
    store = AlarmStore()
    assert store.report(precision((2, 1))) is not None
    assert store.report(precision((1, 2))) is None  # same identity (order-independent): no change
    assert [sorted(a.instance_ids) for a in store.active_precision(1)] == [[1, 2]]
    assert store.active_precision(2) and not store.active_precision(3)
    assert store.precision_groups() == [(1, 2)]
    cleared = store.report(precision((1, 2), AlarmAction.CLEAR))
    assert cleared is not None and cleared.action is AlarmAction.CLEAR
    assert not store.active_precision(1) and not store.active_precision(2)
    assert store.entries(active_only=True) == []
    assert [a.action for a in store.entries()] == [AlarmAction.CLEAR]


def test_clear_precision_by_instance_clears_every_group_containing_it() -> None:
    store = AlarmStore()
    store.report(precision((1, 2)))
    store.report(precision((1, 3)))
    store.report(precision((4, 5)))
    store.report(Alarm(AlarmKind.COORDINATOR_PROMOTED, AlarmAction.RAISE, "coord@b", ()))
    cleared = store.clear_precision(1)
    assert sorted(a.instance_ids for a in cleared) == [(1, 2), (1, 3)]
    assert store.precision_groups() == [(4, 5)]
    assert len(store.entries(active_only=True)) == 2
    assert store.clear_precision(1) == []


def test_clear_of_unknown_alarm_is_a_no_op() -> None:
    assert AlarmStore().report(precision((9,), AlarmAction.CLEAR)) is None
