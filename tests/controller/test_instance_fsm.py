from __future__ import annotations

import pytest

from motor_common.domain import EndpointStatus as ES
from motor_controller.assembly import assemble
from motor_controller.instance_fsm import TRANSITIONS, Signal, observe, transition
from motor_controller.model import InstanceState as S
from motor_controller.model import ManagedInstance, NodeState
from tests.controller.factories import obs, record, spec

TIMEOUT = 3.0


def make_instance(n: int = 2) -> tuple[ManagedInstance, dict]:  # type: ignore[type-arg]
    specs = [spec(r, n) for r in range(n)]
    a = assemble("job-p", specs, 0, 29550)
    assert a is not None and a.instance is not None
    mi = ManagedInstance(a.instance_id, "job-p", 0, S.ACTIVE, a.instance, a.node_ids, a.master_address, 0.0)
    return mi, {s.node_id: record(s) for s in specs}


@pytest.mark.parametrize(
    ("state", "signal", "expected"),
    [
        (S.INITIAL, Signal.START_DISPATCHED, S.STARTING),
        (S.INITIAL, Signal.HEALTHY, S.ACTIVE),
        (S.STARTING, Signal.HEALTHY, S.ACTIVE),
        (S.STARTING, Signal.PAUSED, S.ACTIVE),
        (S.STARTING, Signal.PENDING, None),
        (S.STARTING, Signal.ABNORMAL, None),
        (S.STARTING, Signal.NODE_LOST, S.INACTIVE),
        (S.ACTIVE, Signal.NODE_LOST, S.INACTIVE),
        (S.ACTIVE, Signal.ABNORMAL, S.INACTIVE),
        (S.ACTIVE, Signal.PENDING, S.INACTIVE),
        (S.ACTIVE, Signal.UNKNOWN, None),
        (S.ACTIVE, Signal.HEALTHY, None),
        (S.INACTIVE, Signal.HEALTHY, S.ACTIVE),
        (S.INACTIVE, Signal.NODE_LOST, None),
        (S.INACTIVE, Signal.UNKNOWN, None),
        (S.ACTIVE, Signal.RECOVERY_BEGIN, S.RECOVERING),
        (S.INACTIVE, Signal.RECOVERY_BEGIN, S.RECOVERING),
        (S.RECOVERING, Signal.HEALTHY, None),
        (S.RECOVERING, Signal.RECOVERY_DONE, S.INACTIVE),
        (S.RECOVERING, Signal.RECOVERY_FAILED, S.INACTIVE),
        (S.RECOVERING, Signal.TERMINATE, S.DELETED),
        (S.ACTIVE, Signal.TERMINATE, S.DELETED),
        (S.INITIAL, Signal.TERMINATE, S.DELETED),
        (S.DELETED, Signal.HEALTHY, None),
        (S.DELETED, Signal.TERMINATE, None),
    ],
)
def test_transition_table(state: S, signal: Signal, expected: S | None) -> None:
    assert transition(state, signal) is expected


def test_deleted_is_terminal() -> None:
    assert not [k for k in TRANSITIONS if k[0] is S.DELETED]


def test_healthy_needs_fresh_heartbeats_from_every_node_with_every_endpoint_normal() -> None:
    mi, nodes = make_instance()
    now = 100.0
    good = {n: obs(now - 1, mi.id, [ES.NORMAL, ES.NORMAL]) for n in nodes}
    assert observe(mi, nodes, good, now, TIMEOUT, 0.0)[0] is Signal.HEALTHY
    stale = dict(good, **{"job-p-n1": obs(now - TIMEOUT, mi.id, [ES.NORMAL, ES.NORMAL])})
    sig, why = observe(mi, nodes, stale, now, TIMEOUT, 0.0)
    assert sig is Signal.NODE_LOST and "job-p-n1" in why
    abnormal = dict(good, **{"job-p-n0": obs(now, mi.id, [ES.NORMAL, ES.ABNORMAL])})
    assert observe(mi, nodes, abnormal, now, TIMEOUT, 0.0)[0] is Signal.ABNORMAL
    starting = dict(good, **{"job-p-n0": obs(now, mi.id, [ES.INITIAL, ES.NORMAL], NodeState.STARTING)})
    assert observe(mi, nodes, starting, now, TIMEOUT, 0.0)[0] is Signal.PENDING
    other = dict(good, **{"job-p-n0": obs(now, 0, [], NodeState.REGISTERED)})
    assert observe(mi, nodes, other, now, TIMEOUT, 0.0)[0] is Signal.PENDING
    paused = dict(good, **{"job-p-n0": obs(now, mi.id, [ES.PAUSED, ES.NORMAL])})
    assert observe(mi, nodes, paused, now, TIMEOUT, 0.0)[0] is Signal.PAUSED
    missing_ep = dict(good, **{"job-p-n0": obs(now, mi.id, [ES.NORMAL])})
    assert observe(mi, nodes, missing_ep, now, TIMEOUT, 0.0)[0] is Signal.PENDING


def test_partial_loss_does_not_flap_back_to_active() -> None:
    """One node lost, the other keeps heartbeating NORMAL: INACTIVE stays INACTIVE at every tick."""
    mi, nodes = make_instance()
    state = S.ACTIVE
    lost_at = 10.0
    history = []
    for tick in range(100):
        now = 10.0 + tick * 0.5
        observations = {
            "job-p-n0": obs(now, mi.id, [ES.NORMAL, ES.NORMAL]),
            "job-p-n1": obs(lost_at, mi.id, [ES.NORMAL, ES.NORMAL]),
        }
        sig, _ = observe(mi, nodes, observations, now, TIMEOUT, 0.0)
        state = transition(state, sig) or state
        history.append(state)
    first_inactive = history.index(S.INACTIVE)
    assert first_inactive * 0.5 <= TIMEOUT
    assert all(s is S.INACTIVE for s in history[first_inactive:])


def test_node_returning_fresh_brings_instance_back() -> None:
    mi, nodes = make_instance()
    now = 50.0
    ob = {n: obs(now, mi.id, [ES.NORMAL, ES.NORMAL]) for n in nodes}
    assert transition(S.INACTIVE, observe(mi, nodes, ob, now, TIMEOUT, 0.0)[0]) is S.ACTIVE


def test_nodes_loaded_from_store_are_unknown_for_the_whole_reattach_grace_then_lost() -> None:
    mi, nodes = make_instance()
    loaded = {n: r.__class__(r.spec, r.registered_at, None) for n, r in nodes.items()}
    grace_end = 9.0  # longer than the heartbeat timeout: the fleet's reconnect back-off
    for now in (1.0, TIMEOUT + 0.1, grace_end - 0.01):
        assert observe(mi, loaded, {}, now, TIMEOUT, grace_end)[0] is Signal.UNKNOWN
    assert observe(mi, loaded, {}, grace_end, TIMEOUT, grace_end)[0] is Signal.NODE_LOST
    # UNKNOWN moves no state: an ACTIVE instance stays ACTIVE (and in the coordinators) meanwhile
    assert transition(S.ACTIVE, Signal.UNKNOWN) is None


def test_freshly_registered_node_without_heartbeat_is_pending_then_lost() -> None:
    mi, nodes = make_instance(1)
    assert observe(mi, nodes, {}, 1.0, TIMEOUT, 0.0)[0] is Signal.PENDING
    assert observe(mi, nodes, {}, TIMEOUT + 0.1, TIMEOUT, 0.0)[0] is Signal.NODE_LOST
