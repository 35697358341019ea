"""The nodemanager's DP scale-down transaction state machine (pure)."""

from __future__ import annotations

from motor_nodemanager import scale_down as sd
from motor_nodemanager.scale_down import (
    Effect,
    EngineHealth,
    Event,
    Phase,
    Reported,
    Txn,
    Verdict,
    step,
)


def guarded(rid: str = "r1", now: float = 0.0, lease: float = 10.0) -> Txn:
    return step(Txn(), Event.GUARD, request_id=rid, now=now, lease_sec=lease, dead_ranks=[1], instance_id=7).txn


def test_every_phase_event_pair_is_in_the_table() -> None:
    for p in Phase:
        for e in (Event.GUARD, Event.APPLY, Event.COMMIT, Event.ABORT):
            for m in sd.Match:
                assert (p, e, m) in sd.TRANSITIONS or (p is Phase.IDLE and m is sd.Match.SAME)


def test_guard_apply_commit_retires_the_dead_ranks_and_proxies_apply_exactly_once() -> None:
    g = step(Txn(), Event.GUARD, request_id="r1", now=0, lease_sec=10, dead_ranks=[1], instance_id=7)
    assert (g.txn.phase, g.verdict, g.effect, g.txn.lease_deadline) == (Phase.GUARDED, Verdict.OK, Effect.FREEZE, 10)
    a = step(g.txn, Event.APPLY, request_id="r1", now=1)
    assert (a.txn.phase, a.effect, a.ranks) == (Phase.APPLYING, Effect.PROXY_APPLY, frozenset({1}))
    again = step(a.txn, Event.APPLY, request_id="r1", now=2)
    assert (again.verdict, again.effect) == (Verdict.REPEAT, Effect.NONE)  # never re-proxied
    c = step(again.txn, Event.COMMIT, request_id="r1", now=3)
    assert (c.txn.phase, c.effect, c.txn.retired) == (Phase.IDLE, Effect.RETIRE, frozenset({1}))
    # finalize repeated with the same decision: idempotent, same retired ranks
    rep = step(c.txn, Event.COMMIT, request_id="r1", now=4)
    assert (rep.verdict, rep.ranks) == (Verdict.REPEAT, frozenset({1}))
    # an apply for the finished transaction never reaches the engines again
    assert step(c.txn, Event.APPLY, request_id="r1", now=5).verdict is Verdict.STALE
    assert step(c.txn, Event.GUARD, request_id="r1", now=5, lease_sec=1, dead_ranks=[1]).verdict is Verdict.STALE


def test_stale_or_foreign_request_ids_are_aborted() -> None:
    t = guarded("r1")
    assert step(t, Event.GUARD, request_id="r2", lease_sec=5, dead_ranks=[0]).verdict is Verdict.BUSY
    assert step(t, Event.APPLY, request_id="r0").verdict is Verdict.STALE
    assert step(t, Event.COMMIT, request_id="r0").verdict is Verdict.STALE
    assert step(Txn(), Event.APPLY, request_id="r1").verdict is Verdict.STALE
    assert step(Txn(), Event.ABORT, request_id="r1").verdict is Verdict.STALE
    aborted = step(t, Event.ABORT, request_id="r1").txn
    assert step(aborted, Event.COMMIT, request_id="r1").verdict is Verdict.STALE  # other decision than recorded


def test_commit_before_apply_is_refused() -> None:
    st = step(guarded(), Event.COMMIT, request_id="r1")
    assert (st.verdict, st.txn.phase) == (Verdict.NOT_APPLIED, Phase.GUARDED)


def test_a_guard_whose_lease_expires_without_finalize_reverts() -> None:
    t = guarded("r1", now=0, lease=10)
    assert step(t, Event.EXPIRE, now=9.9).verdict is Verdict.REPEAT
    renewed = step(t, Event.GUARD, request_id="r1", now=5, lease_sec=10, dead_ranks=[1]).txn
    assert renewed.lease_deadline == 15
    applied = step(renewed, Event.APPLY, request_id="r1", now=6).txn
    gone = step(applied, Event.EXPIRE, now=15)
    assert (gone.txn.phase, gone.effect, gone.txn.retired) == (Phase.IDLE, Effect.REVERT, frozenset())
    assert gone.txn.outcome_of("r1") == "expire"
    assert step(gone.txn, Event.COMMIT, request_id="r1").verdict is Verdict.STALE


def test_commits_accumulate_retired_ranks() -> None:
    t = step(step(guarded("r1"), Event.APPLY, request_id="r1").txn, Event.COMMIT, request_id="r1").txn
    t = step(t, Event.GUARD, request_id="r2", lease_sec=5, dead_ranks=[3]).txn
    t = step(step(t, Event.APPLY, request_id="r2").txn, Event.COMMIT, request_id="r2").txn
    assert t.retired == frozenset({1, 3})


def test_reported_state_follows_phase_and_survivor_health() -> None:
    idle, g = Txn(), guarded()
    applying = step(g, Event.APPLY, request_id="r1").txn
    assert sd.reported_state(False, g, EngineHealth.UNHEALTHY) is Reported.DISABLED
    assert sd.reported_state(True, idle, None) is Reported.IDLE
    assert sd.reported_state(True, g, EngineHealth.HEALTHY) is Reported.GUARDED
    assert sd.reported_state(True, g, EngineHealth.UNHEALTHY) is Reported.UNHEALTHY
    assert sd.reported_state(True, g, EngineHealth.NONE_LEFT) is Reported.UNHEALTHY
    assert sd.reported_state(True, applying, EngineHealth.UNKNOWN) is Reported.APPLYING
    assert sd.reported_state(True, applying, EngineHealth.UNHEALTHY) is Reported.UNHEALTHY
    assert sd.reported_state(True, applying, EngineHealth.HEALTHY) is Reported.HEALTHY


def test_engine_health_aggregation() -> None:
    assert sd.engine_health({0: "healthy", 2: "HEALTHY"}) is EngineHealth.HEALTHY
    assert sd.engine_health({0: "unhealthy", 2: "dead"}) is EngineHealth.UNHEALTHY
    assert sd.engine_health({0: "unhealthy", 2: "healthy"}) is EngineHealth.MIXED
    assert sd.engine_health({0: None}) is EngineHealth.UNKNOWN
    assert sd.engine_health({}) is EngineHealth.NONE_LEFT
