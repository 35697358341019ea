from __future__ import annotations

from dataclasses import replace

from motor_common.domain import Endpoint, EngineType, Instance, InstanceStatus, Role
from motor_controller.instance_fsm import Signal
from motor_controller.model import InstanceState, ManagedInstance
from motor_controller.push_plan import (
    Op,
    OpKind,
    SyncState,
    after_failure,
    after_success,
    check,
    desired_view,
    fingerprint,
    plan_ops,
    unknown_history,
)


def inst(iid: int, port: int = 9000, status: InstanceStatus = InstanceStatus.AVAILABLE) -> Instance:
    return Instance(iid, Role.PREFILL, f"job{iid}", "m", EngineType.VLLM,
                    (Endpoint(0, "10.0.0.1", port, dp_rank=0, node_id="n"),), status)


def synced_state(view: dict[int, Instance], generation: int = 5) -> SyncState:
    return SyncState(generation, view, fingerprint(view))


def test_unknown_state_plans_one_full_set_with_next_generation() -> None:
    ops = plan_ops(SyncState(generation=7), {1: inst(1)}, 0.0)
    assert [(o.kind, o.generation, [i.id for i in o.instances]) for o in ops] == [(OpKind.SET, 8, [1])]


def test_diff_plans_increments_each_stamped_current_plus_one() -> None:
    state = synced_state({1: inst(1), 2: inst(2), 3: inst(3), 4: inst(4, status=InstanceStatus.PAUSED)})
    desired = {
        1: inst(1),  # unchanged
        2: inst(2, port=9100),  # endpoints changed: DEL + ADD
        3: inst(3, status=InstanceStatus.PAUSED),  # PAUSE
        4: inst(4),  # RESUME
        5: inst(5),  # ADD
    }
    ops = plan_ops(state, desired, 0.0)
    assert [(o.kind, o.generation, [i.id for i in o.instances]) for o in ops] == [
        (OpKind.DEL, 6, [2]),
        (OpKind.ADD, 7, [2, 5]),
        (OpKind.PAUSE, 8, [3]),
        (OpKind.RESUME, 9, [4]),
    ]
    for op in ops:
        state = after_success(state, op, op.generation)
    assert state.generation == 9 and state.fingerprint == fingerprint(desired)
    assert plan_ops(state, desired, 0.0) == []


def test_removed_instance_is_deleted_with_its_full_identity() -> None:
    state = synced_state({1: inst(1)})
    ops = plan_ops(state, {}, 0.0)
    assert ops == [Op(OpKind.DEL, (inst(1),), 6)]


def test_failed_increment_enqueues_one_coalesced_set() -> None:
    state = synced_state({1: inst(1)})
    desired = {2: inst(2), 3: inst(3, status=InstanceStatus.PAUSED)}
    ops = plan_ops(state, desired, 0.0)
    state = after_failure(state, ops[0], now=10.0, set_retry_interval=1.0)
    assert state.full_set_pending and state.generation == 5
    again = plan_ops(state, desired, 10.0)
    assert [(o.kind, o.generation) for o in again] == [(OpKind.SET, 6)]
    assert [i.id for i in again[0].instances] == [2, 3]


def test_failed_set_is_not_re_enqueued_immediately_and_does_not_move_fingerprint() -> None:
    state = replace(synced_state({1: inst(1)}), full_set_pending=True)
    before = state.fingerprint
    (op,) = plan_ops(state, {2: inst(2)}, 10.0)
    failed = after_failure(state, op, now=10.0, set_retry_interval=1.0)
    assert failed.fingerprint == before and failed.synced == state.synced and failed.generation == 5
    assert plan_ops(failed, {2: inst(2)}, 10.5) == []  # no recursive retry
    assert [o.kind for o in plan_ops(failed, {2: inst(2)}, 11.0)] == [OpKind.SET]  # bounded retry
    ok = after_success(failed, op, 6)
    assert ok.fingerprint == fingerprint({2: inst(2)}) and not ok.full_set_pending


def test_check_detects_a_restarted_coordinator() -> None:
    view = {1: inst(1)}
    state = synced_state(view, generation=12)
    assert check(state, 12, view) == state
    restarted = check(state, 0, {})
    assert restarted.full_set_pending
    (op,) = plan_ops(restarted, view, 0.0)
    assert op.kind is OpKind.SET and op.generation == 13


def test_check_detects_foreign_writes_and_stamps_above_their_generation() -> None:
    state = synced_state({1: inst(1)}, generation=3)
    checked = check(state, 9, {1: inst(1), 7: inst(7)})
    assert checked.full_set_pending and plan_ops(checked, {1: inst(1)}, 0.0)[0].generation == 10


def test_restarted_controller_adopts_coordinator_list_when_generation_matches() -> None:
    view = {1: inst(1)}
    adopted = check(SyncState(generation=4), 4, view)
    assert adopted.synced == view and not adopted.full_set_pending
    assert plan_ops(adopted, view, 0.0) == []
    assert check(SyncState(generation=4), 2, view).full_set_pending


def test_desired_view_has_active_and_paused_and_recovering_instances() -> None:
    def mi(iid: int, state: InstanceState) -> ManagedInstance:
        return ManagedInstance(iid, f"job{iid}", 0, state, inst(iid), ("n",), "", 0.0)

    view = desired_view(
        [mi(1, InstanceState.ACTIVE), mi(2, InstanceState.ACTIVE), mi(3, InstanceState.INACTIVE),
         mi(4, InstanceState.RECOVERING), mi(5, InstanceState.STARTING), mi(6, InstanceState.DELETED)],
        {1: Signal.HEALTHY, 2: Signal.PAUSED}, wall=0.0,
    )
    assert {i: v.status for i, v in view.items()} == {
        1: InstanceStatus.AVAILABLE, 2: InstanceStatus.PAUSED, 4: InstanceStatus.PAUSED
    }


def test_a_changed_kv_events_port_changes_the_fingerprint() -> None:
    a = inst(1)
    b = replace(a, endpoints=(replace(a.endpoints[0], kv_events_port=6000),))
    assert fingerprint({1: a}) != fingerprint({1: b})


def test_an_operator_paused_instance_is_paused_while_active_and_absent_while_not() -> None:
    def mi(iid: int, state: InstanceState) -> ManagedInstance:
        return ManagedInstance(iid, f"job{iid}", 0, state, inst(iid), ("n",), "", 0.0, paused=True)

    view = desired_view([mi(1, InstanceState.ACTIVE), mi(2, InstanceState.STARTING), mi(3, InstanceState.INACTIVE)],
                        {1: Signal.HEALTHY}, wall=0.0)
    assert {i: v.status for i, v in view.items()} == {1: InstanceStatus.PAUSED}


def test_a_controller_without_a_record_keeps_what_the_coordinator_holds_while_it_holds() -> None:
    """An empty or new store: the coordinator is past generation 0 with instances this controller
    never heard of. While held (re-attach grace), the SET keeps them; a desired instance on one of
    their engines replaces them; once the hold ends they are removed."""
    coordinator = {1: inst(1, port=9001), 2: inst(2, port=9002), 3: inst(3, port=9003)}
    state = check(SyncState(), 42, coordinator)
    assert unknown_history(SyncState(), 42, coordinator) and not unknown_history(SyncState(), 0, {})
    assert not unknown_history(SyncState(generation=42), 42, coordinator)  # our own history
    desired = {7: inst(7, port=9002)}  # re-assembled under a new id on instance 2's engine
    (op,) = plan_ops(state, desired, 0.0, hold=lambda iid: iid not in desired)
    assert op.kind is OpKind.SET and op.generation == 43
    assert [i.id for i in op.instances] == [1, 3, 7]
    (unheld,) = plan_ops(state, desired, 0.0)  # no hold: the controller's view is the whole truth
    assert [i.id for i in unheld.instances] == [7]
    # synced after the held SET: no DEL while held, the DEL of the strays once the hold ends
    synced = after_success(state, op, 43)
    assert plan_ops(synced, desired, 0.0, hold=lambda iid: iid in (1, 3)) == []
    (dels,) = plan_ops(synced, desired, 0.0)
    assert dels.kind is OpKind.DEL and [i.id for i in dels.instances] == [1, 3] and dels.generation == 44


def test_a_held_instance_is_still_replaced_when_its_content_changes() -> None:
    state = synced_state({1: inst(1), 2: inst(2, port=9100)})
    ops = plan_ops(state, {1: inst(1, port=9200)}, 0.0, hold=lambda iid: True)
    # 1 changed: DEL + ADD (a replacement, not a removal); 2 is held, not deleted
    assert [(o.kind, [i.id for i in o.instances]) for o in ops] == [(OpKind.DEL, [1]), (OpKind.ADD, [1])]


def lost_node(iid: int = 1, routable_until: float = 1300.0, paused: bool = False) -> ManagedInstance:
    """INACTIVE because its node was lost at wall 1000 with a 300 s routing grace."""
    return ManagedInstance(iid, f"job{iid}", 0, InstanceState.INACTIVE, inst(iid), ("n",), "", 1000.0,
                           reason="node n: last heartbeat 3.1s ago (timeout 3s)", routable_until=routable_until,
                           paused=paused)


def test_an_instance_whose_node_is_lost_stays_available_within_its_grace_and_leaves_after() -> None:
    mis = [lost_node(1), ManagedInstance(2, "job2", 0, InstanceState.ACTIVE, inst(2, 9002), ("m",), "", 0.0)]
    signals = {1: Signal.NODE_LOST, 2: Signal.HEALTHY}
    within = desired_view(mis, signals, wall=1299.9)
    assert {i: v.status for i, v in within.items()} == {1: InstanceStatus.AVAILABLE, 2: InstanceStatus.AVAILABLE}
    assert within[1] == inst(1)  # what an ACTIVE instance shows: same content, no DEL + ADD
    after = desired_view(mis, signals, wall=1300.0)
    assert set(after) == {2}
    # a synced coordinator gets a DEL of it once the grace is over (the fingerprint moves then)
    state = synced_state(within)
    assert plan_ops(state, within, 0.0) == []
    assert fingerprint(after) != fingerprint(within)
    assert [(o.kind, [i.id for i in o.instances]) for o in plan_ops(state, after, 0.0)] == [(OpKind.DEL, [1])]


def test_an_instance_whose_node_is_back_with_another_signal_leaves_at_once() -> None:
    for sig in (Signal.ABNORMAL, Signal.HEALTHY, Signal.PAUSED):
        assert desired_view([lost_node()], {1: sig}, wall=1100.0) == {}, sig
    # not observed by this process yet (a restarted controller), re-attaching, or PENDING while its
    # nodemanager comes back (the reconcile plan clears routable_until for any other PENDING): kept
    for signals in ({}, {1: Signal.UNKNOWN}, {1: Signal.PENDING}):
        assert set(desired_view([lost_node()], signals, wall=1100.0)) == {1}, signals


def test_without_a_routing_grace_a_lost_node_takes_the_instance_out_at_once() -> None:
    assert desired_view([lost_node(routable_until=0.0)], {1: Signal.NODE_LOST}, wall=1000.0) == {}
    # only INACTIVE instances are kept by it (a stale stamp on another state changes nothing)
    for state in (InstanceState.STARTING, InstanceState.DELETED, InstanceState.INITIAL):
        assert desired_view([replace(lost_node(), state=state)], {1: Signal.NODE_LOST}, wall=1100.0) == {}


def test_an_operator_paused_instance_whose_node_is_lost_stays_paused_within_the_grace() -> None:
    view = desired_view([lost_node(paused=True)], {1: Signal.NODE_LOST}, wall=1100.0)
    assert {i: v.status for i, v in view.items()} == {1: InstanceStatus.PAUSED}
