"""Self-termination arbitration (pure)."""

from __future__ import annotations

from motor_common.domain import EndpointStatus as S
from motor_nodemanager.arbiter import Arbiter
from motor_nodemanager.endpoint_state import EndpointState


def ep(eid: int, status: S, was_normal: bool = True) -> EndpointState:
    return EndpointState(eid, status, was_normal=was_normal)


def test_terminates_after_threshold_consecutive_abnormal_intervals() -> None:
    a = Arbiter(3)
    verdicts = [a.tick([ep(0, S.ABNORMAL), ep(1, S.NORMAL)], now=i).terminate for i in range(3)]
    assert verdicts == [False, False, True]


def test_a_normal_interval_resets_the_streak() -> None:
    a = Arbiter(2)
    assert not a.tick([ep(0, S.ABNORMAL)], 0).terminate
    assert not a.tick([ep(0, S.NORMAL)], 1).terminate
    assert not a.tick([ep(0, S.ABNORMAL)], 2).terminate
    assert a.tick([ep(0, S.ABNORMAL)], 3).terminate


def test_an_endpoint_never_normal_does_not_count() -> None:
    a = Arbiter(1)
    for i in range(10):
        assert not a.tick([ep(0, S.ABNORMAL, was_normal=False)], i).terminate


def test_paused_and_initial_do_not_count() -> None:
    a = Arbiter(1)
    assert not a.tick([ep(0, S.PAUSED), ep(1, S.INITIAL)], 0).terminate


def test_freeze_blocks_termination_until_it_expires() -> None:
    a = Arbiter(1)
    a.freeze(until=10.0)
    v = a.tick([ep(0, S.ABNORMAL)], 5.0)
    assert not v.terminate and v.frozen
    v = a.tick([ep(0, S.ABNORMAL)], 10.0)
    assert v.terminate and v.freeze_expired


def test_unfreeze_resumes_arbitration_at_once() -> None:
    a = Arbiter(1)
    a.freeze(until=100.0)
    assert not a.tick([ep(0, S.ABNORMAL)], 1).terminate
    a.unfreeze()
    assert a.tick([ep(0, S.ABNORMAL)], 2).terminate


def test_freeze_only_extends() -> None:
    a = Arbiter(1)
    a.freeze(50.0)
    a.freeze(20.0)
    assert a.frozen_until == 50.0


def test_no_streak_counts_while_the_states_are_being_replaced_and_it_restarts_from_zero() -> None:
    a = Arbiter(2)
    assert not a.tick([ep(0, S.ABNORMAL)], 0).terminate  # 1/2
    for i in range(1, 10):  # a start command replaces the engines: the stale ABNORMAL never counts
        v = a.tick([ep(0, S.ABNORMAL)], i, replacing=True)
        assert not v.terminate and v.streaks == ()
    assert not a.tick([ep(0, S.ABNORMAL)], 10).terminate  # counting starts again at 1/2
    assert a.tick([ep(0, S.ABNORMAL)], 11).terminate
