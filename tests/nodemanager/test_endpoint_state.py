"""Endpoint status transitions (table-driven, pure)."""

from __future__ import annotations

import pytest

from motor_common.domain import EndpointStatus as S
from motor_nodemanager import endpoint_state as es
from motor_nodemanager.endpoint_state import Observation as O

GRACE = 120.0


def at(status: S, *, launched_at: float = 0.0, generation: int = 1, was_normal: bool = False) -> es.EndpointState:
    return es.EndpointState(0, status, generation, launched_at, pid=10, was_normal=was_normal)


def obs(state: es.EndpointState, o: O, now: float, generation: int = 1) -> es.EndpointState:
    return es.observe(state, o, generation=generation, now=now, grace_sec=GRACE, detail="d")


@pytest.mark.parametrize(
    ("start", "o", "now", "expected"),
    [
        (S.INITIAL, O.HEALTHY, 1, S.NORMAL),
        (S.INITIAL, O.UNHEALTHY, 1, S.INITIAL),  # grace keeps the previous state
        (S.INITIAL, O.UNHEALTHY, 500, S.ABNORMAL),
        (S.INITIAL, O.EXITED, 1, S.ABNORMAL),  # a dead process is no slow load
        (S.NORMAL, O.UNHEALTHY, 1, S.NORMAL),
        (S.NORMAL, O.UNHEALTHY, 500, S.ABNORMAL),
        (S.ABNORMAL, O.HEALTHY, 500, S.NORMAL),
        (S.ABNORMAL, O.UNHEALTHY, 1, S.ABNORMAL),
        (S.PAUSED, O.HEALTHY, 500, S.PAUSED),
        (S.PAUSED, O.UNHEALTHY, 500, S.PAUSED),
        (S.PAUSED, O.EXITED, 500, S.PAUSED),
        (S.RETIRED, O.HEALTHY, 500, S.RETIRED),
    ],
)
def test_transition_table(start: S, o: O, now: float, expected: S) -> None:
    assert obs(at(start), o, now).status is expected


def test_every_status_observation_pair_has_a_rule() -> None:
    for s in S:
        for o in O:
            assert (s, o) in es.TRANSITIONS


def test_normal_sets_was_normal_and_it_survives_abnormal() -> None:
    st = obs(at(S.INITIAL), O.HEALTHY, 1)
    assert st.was_normal
    st = obs(st, O.UNHEALTHY, 500)
    assert st.status is S.ABNORMAL and st.was_normal


def test_failure_streak_passes_a_failure_on_only_as_the_thresholds_in_a_row() -> None:
    streak, seen = 0, []
    for o in [O.UNHEALTHY, O.UNHEALTHY, O.HEALTHY, O.UNHEALTHY, O.UNHEALTHY, O.UNHEALTHY, O.UNHEALTHY]:
        streak, counts = es.failure_streak(streak, o, 3)
        seen.append((streak, counts))
    assert seen == [(1, False), (2, False), (0, True), (1, False), (2, False), (3, True), (4, True)]
    assert es.failure_streak(0, O.UNHEALTHY, 1) == (1, True)


def test_stale_generation_probe_is_ignored() -> None:
    st = at(S.NORMAL, generation=5, was_normal=True)
    assert obs(st, O.UNHEALTHY, 500, generation=4) is st
    assert obs(st, O.UNHEALTHY, 500, generation=5).status is S.ABNORMAL


def test_newer_generation_makes_older_probes_stale() -> None:
    st = es.with_generation(at(S.NORMAL, generation=1), 3)
    assert obs(st, O.UNHEALTHY, 500, generation=2) is st


def test_pause_is_sticky_and_resume_restores_the_previous_status() -> None:
    st = es.pause(at(S.NORMAL, was_normal=True))
    assert st.status is S.PAUSED
    st = obs(st, O.HEALTHY, 500)
    assert st.status is S.PAUSED
    assert es.resume(st).status is S.NORMAL


def test_relaunch_resets_to_initial_never_normal() -> None:
    st = es.launched(3, generation=2, now=10.0, pid=99)
    assert (st.status, st.was_normal, st.pid, st.launched_at) == (S.INITIAL, False, 99, 10.0)
