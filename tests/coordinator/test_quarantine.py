"""Parole of poison suspects (pure): one member of a hung engine's group at a time; a conviction
frees the rest."""

from __future__ import annotations

from motor_coordinator.quarantine import Quarantine, Turn

A = (("127.0.0.1", 8000), 100.0)  # engine A's silence that began at t=100
B = (("127.0.0.1", 8001), 105.0)


def test_members_are_paroled_one_at_a_time_in_order() -> None:
    q = Quarantine()
    t1, t2, t3 = q.join(A), q.join(A), q.join(A)
    assert [q.turn(t) for t in (t1, t2, t3)] == [Turn.PAROLE, Turn.WAIT, Turn.WAIT]
    assert q.cleared(t1) == [t2]  # t1 was answered elsewhere: a victim; t2's turn
    assert [q.turn(t) for t in (t2, t3)] == [Turn.PAROLE, Turn.WAIT]
    assert q.cleared(t2) == [t3]
    assert q.cleared(t3) == []
    assert len(q) == 0


def test_a_conviction_frees_the_rest_of_the_group_and_later_members() -> None:
    q = Quarantine()
    poison, v1, v2 = q.join(A), q.join(A), q.join(A)
    assert q.convicted(poison) == [v1, v2]
    assert q.turn(v1) is Turn.FREE and q.turn(v2) is Turn.FREE
    late = q.join(A)  # another victim of the same silence stalls later: free at once
    assert q.turn(late) is Turn.FREE
    for t in (v1, v2, late):
        assert q.leave(t) == []
    assert len(q) == 0


def test_an_explained_hang_frees_that_engines_waiting_suspects() -> None:
    q = Quarantine()
    b1, b2 = q.join(B), q.join(B)  # requests on B when a paroled poison hung it
    assert q.explain(B) == [b2]  # b1 is already on parole; b2 goes free
    assert q.turn(b2) is Turn.FREE
    assert q.cleared(b1) == []


def test_groups_are_independent_and_a_waiter_that_gives_up_is_skipped() -> None:
    q = Quarantine()
    a1, a2, a3 = q.join(A), q.join(A), q.join(A)
    b1 = q.join(B)
    assert q.turn(b1) is Turn.PAROLE  # B's group does not wait for A's
    assert q.leave(a2) == []  # a2's client went away while it waited
    assert q.cleared(a1) == [a3]
    assert q.turn(a3) is Turn.PAROLE
    assert q.group_of(a3) == A


def test_a_group_forgotten_when_empty_starts_afresh() -> None:
    q = Quarantine()
    t = q.join(A)
    q.cleared(t)
    again = q.join(A)
    assert q.turn(again) is Turn.PAROLE
