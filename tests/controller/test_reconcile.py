from __future__ import annotations

from dataclasses import replace

from motor_common.domain import Capabilities
from motor_common.domain import EndpointStatus as ES
from motor_controller.assembly import instance_id_for
from motor_controller.instance_fsm import Signal
from motor_controller.model import InstanceState, NodeState
from motor_controller.reconcile import Plan, World, plan
from tests.controller.factories import obs, record, spec


def world(**kw: object) -> World:
    base: dict[str, object] = dict(
        nodes={}, observations={}, instances={}, incarnations={}, start_gates={}, now=10.0, wall=1000.0,
        reattach_until=0.0, heartbeat_timeout=3.0, master_port=29550,
    )
    base.update(kw)
    return World(**base)  # type: ignore[arg-type]


def step(w: World) -> tuple[World, Plan]:
    p = plan(w)
    gates = dict(w.start_gates)
    for c in p.starts:
        gates[c.node_id] = (c.instance_id, w.now + 5.0)
    incs = {**w.incarnations, **p.incarnations}
    return replace(w, instances={**w.instances, **p.upserts}, incarnations=incs, start_gates=gates), p


def two_nodes(registered_mono: float | None = 9.0) -> dict:  # type: ignore[type-arg]
    return {s.node_id: record(s, registered_mono) for s in (spec(0, 2), spec(1, 2))}


IID = instance_id_for("job-p", 0)


def test_complete_job_is_assembled_and_started_only_after_heartbeats() -> None:
    w, p = step(world(nodes=two_nodes()))
    (mi,) = p.upserts.values()
    assert mi.id == IID and mi.state is InstanceState.INITIAL and p.starts == []
    registered = {n: obs(10.0, 0, [], NodeState.REGISTERED) for n in w.nodes}
    w, p = step(replace(w, observations=registered))
    assert sorted(c.node_id for c in p.starts) == ["job-p-n0", "job-p-n1"]
    assert w.instances[IID].state is InstanceState.STARTING
    # retried plan: the gate makes it a no-op
    w2, p2 = step(w)
    assert p2.starts == [] and p2.upserts == {}
    running = {n: obs(10.5, IID, [ES.NORMAL, ES.NORMAL]) for n in w.nodes}
    w, p = step(replace(w2, observations=running, now=10.6))
    assert w.instances[IID].state is InstanceState.ACTIVE and p.starts == []


def test_capability_mismatch_is_recorded_not_started() -> None:
    nodes = {s.node_id: record(s, 9.0) for s in (spec(0, 2, caps=Capabilities(True)), spec(1, 2))}
    observations = {n: obs(10.0, 0, [], NodeState.REGISTERED) for n in nodes}
    w, p = step(world(nodes=nodes, observations=observations))
    (mi,) = p.upserts.values()
    assert mi.blocked and "capabilities differ" in mi.reason and p.starts == []
    w, p = step(w)
    assert p.upserts == {}  # stable: nothing rewritten each tick


def test_lost_node_that_re_registers_rejoins_and_gets_start_again() -> None:
    w, _ = step(world(nodes=two_nodes()))
    running = {n: obs(10.0, IID, [ES.NORMAL, ES.NORMAL]) for n in w.nodes}
    w, _ = step(replace(w, observations=running))
    assert w.instances[IID].state is InstanceState.ACTIVE
    # n1 stops heartbeating
    w, _ = step(replace(w, now=13.5, observations={**running, "job-p-n0": obs(13.4, IID, [ES.NORMAL] * 2)}))
    assert w.instances[IID].state is InstanceState.INACTIVE
    # n1 re-registers (new process) and heartbeats REGISTERED
    nodes = {**w.nodes, "job-p-n1": record(spec(1, 2), 14.0)}
    obsv = {"job-p-n0": obs(14.0, IID, [ES.NORMAL] * 2), "job-p-n1": obs(14.0, 0, [], NodeState.REGISTERED)}
    w, p = step(replace(w, now=14.1, nodes=nodes, observations=obsv))
    assert [c.node_id for c in p.starts] == ["job-p-n1"] and w.instances[IID].state is InstanceState.INACTIVE
    obsv["job-p-n1"] = obs(14.5, IID, [ES.NORMAL] * 2)
    w, _ = step(replace(w, now=14.6, observations=obsv))
    assert w.instances[IID].state is InstanceState.ACTIVE


def test_restarted_controller_sends_no_start_to_nodes_running_the_instance() -> None:
    w, _ = step(world(nodes=two_nodes()))
    running = {n: obs(10.0, IID, [ES.NORMAL, ES.NORMAL]) for n in w.nodes}
    w, _ = step(replace(w, observations=running))
    # restart: nodes loaded from store (registered_mono None), no heartbeats yet
    loaded = two_nodes(None)
    r = world(nodes=loaded, instances=w.instances, now=100.0, reattach_until=103.0)
    r, p = step(r)
    assert p.starts == [] and p.upserts == {}  # UNKNOWN within grace: nothing moves
    r, p = step(replace(r, now=100.5, observations={n: obs(100.5, IID, [ES.NORMAL] * 2) for n in loaded}))
    assert p.starts == [] and r.instances[IID].state is InstanceState.ACTIVE


def test_restarted_controller_changes_nothing_until_its_reattach_grace_ends() -> None:
    w, _ = step(world(nodes=two_nodes()))
    w, _ = step(replace(w, observations={n: obs(10.0, IID, [ES.NORMAL, ES.NORMAL]) for n in w.nodes}))
    assert w.instances[IID].state is InstanceState.ACTIVE
    loaded = two_nodes(None)
    # restarted at 100 with a 9 s grace: far beyond the 3 s heartbeat timeout nothing moves
    r = world(nodes=loaded, instances=w.instances, now=100.0, reattach_until=109.0)
    for now in (100.0, 103.5, 108.9):
        r, p = step(replace(r, now=now))
        assert p.upserts == {} and p.starts == [] and p.partial_losses == {}
    # a node that never re-attached is lost only once the grace is over
    r, p = step(replace(r, now=109.0))
    assert r.instances[IID].state is InstanceState.INACTIVE


def test_node_displaced_by_another_pod_retires_the_instance_and_bumps_the_id() -> None:
    w, _ = step(world(nodes=two_nodes()))
    nodes = dict(w.nodes)
    del nodes["job-p-n1"]
    nodes["pod-new"] = record(spec(1, 2, node_id="pod-new"), 10.0)
    w, _ = step(replace(w, nodes=nodes))
    assert w.instances[IID].state is InstanceState.DELETED
    new_id = instance_id_for("job-p", 1)
    assert w.instances[new_id].state is InstanceState.INITIAL and w.incarnations["job-p"] == 1
    assert w.instances[new_id].node_ids == ("job-p-n0", "pod-new")


def active_two_nodes() -> World:
    w, _ = step(world(nodes=two_nodes()))
    w, _ = step(replace(w, observations={n: obs(10.0, 0, [], NodeState.REGISTERED) for n in w.nodes}))
    w, _ = step(replace(w, observations={n: obs(10.5, IID, [ES.NORMAL, ES.NORMAL]) for n in w.nodes}, now=10.6))
    assert w.instances[IID].state is InstanceState.ACTIVE
    return w


def test_restarted_nodes_with_the_same_ids_and_new_ports_rejoin_the_same_instance() -> None:
    w = active_two_nodes()
    # node 1 comes back (same node id, other ports); node 0 is not back yet: nothing starts
    moved = spec(1, 2, base_port=9000)
    nodes = {**w.nodes, moved.node_id: record(moved, 20.0)}
    fresh = {"job-p-n1": obs(20.0, 0, [], NodeState.REGISTERED)}
    w, p = step(replace(w, nodes=nodes, observations=fresh, now=20.1, start_gates={}))
    assert p.starts == [] and w.instances[IID].state is not InstanceState.DELETED
    assert w.instances[IID].generation == 1
    # node 0 back too: refreshed in place (same id, generation + 1), both started with the new ports
    back = spec(0, 2, base_port=9100)
    nodes = {**nodes, back.node_id: record(back, 20.2)}
    fresh = {n: obs(20.2, 0, [], NodeState.REGISTERED) for n in nodes}
    w, p = step(replace(w, nodes=nodes, observations=fresh, now=20.3))
    mi = w.instances[IID]
    assert mi.state is not InstanceState.DELETED and mi.generation == 2 and p.incarnations == {}
    assert mi.instance is not None and sorted(e.business_port for e in mi.instance.endpoints)[0] >= 9000
    assert sorted(c.node_id for c in p.starts) == ["job-p-n0", "job-p-n1"]
    assert all(c.instance_id == IID and c.generation == 2 for c in p.starts)


def test_another_node_id_for_a_rank_still_retires_the_instance() -> None:
    w = active_two_nodes()
    other = spec(1, 2, node_id="elsewhere")
    nodes = {k: v for k, v in w.nodes.items() if k != "job-p-n1"} | {"elsewhere": record(other, 20.0)}
    w, p = step(replace(w, nodes=nodes, observations={}, now=20.1))
    assert w.instances[IID].state is InstanceState.DELETED and p.incarnations == {"job-p": 1}


def test_partial_loss_survivors_are_only_nodes_still_running_the_instance() -> None:
    from motor_controller.reconcile import partial_loss

    w = active_two_nodes()
    now = 12.0
    running = obs(11.9, IID, [ES.NORMAL, ES.NORMAL])
    w = replace(w, now=now, observations={"job-p-n1": running})  # n0 lost
    assert partial_loss(w.instances[IID], w) == ("job-p-n1",)
    restarted = obs(11.9, 0, [], NodeState.REGISTERED)  # n1 already restarted: nothing to stop
    assert partial_loss(w.instances[IID], replace(w, observations={"job-p-n1": restarted})) == ()


def test_a_node_heard_from_since_the_start_is_judged_lost_even_within_the_reattach_grace() -> None:
    # A fresh controller (grace until 109) whose fleet registered and heartbeated after its start:
    # the grace protects only nodes loaded from the store, so a node that dies is a partial loss.
    w = replace(active_two_nodes(), reattach_until=109.0)
    only_n1 = {"job-p-n1": obs(12.0, IID, [ES.NORMAL, ES.NORMAL])}
    w, p = step(replace(w, observations={**w.observations, **only_n1}, now=14.0))
    assert w.instances[IID].state is InstanceState.INACTIVE
    assert p.partial_losses == {IID: ("job-p-n1",)}


def test_a_lost_store_gets_back_the_incarnation_the_nodes_run_instead_of_restarting_them() -> None:
    """The store is lost (no incarnation known) while the job's nodes run incarnation 2 (its id):
    the instance assembled at registration (incarnation 0, never started) is superseded once their
    heartbeats show it, and incarnation 2 is ACTIVE at once with no start command (before, the
    nodes got StartEngines for incarnation 0: every engine restarted)."""
    w, p = step(world(nodes=two_nodes()))
    assert list(p.upserts) == [IID]  # registered, no heartbeat yet: incarnation 0
    iid2 = instance_id_for("job-p", 2)
    running = {n: obs(10.2, iid2, [ES.NORMAL, ES.NORMAL]) for n in w.nodes}
    w, p = step(replace(w, observations=running, now=10.3))
    assert p.starts == [] and p.incarnations == {"job-p": 2}
    assert w.instances[IID].state is InstanceState.DELETED and "incarnation 2" in w.instances[IID].reason
    assert w.instances[iid2].state is InstanceState.ACTIVE and w.instances[iid2].incarnation == 2
    w, p = step(replace(w, now=10.4))
    assert p.upserts == {} and p.starts == []  # stable


def test_nodes_running_an_older_incarnation_or_disagreeing_do_not_move_the_record() -> None:
    known = instance_id_for("job-p", 3)
    old = {n: obs(10.0, instance_id_for("job-p", 1), [ES.NORMAL, ES.NORMAL]) for n in two_nodes()}
    _, p = step(world(nodes=two_nodes(), observations=old, incarnations={"job-p": 3}))
    assert list(p.upserts) == [known] and p.incarnations == {}
    assert sorted(c.instance_id for c in p.starts) == [known, known]  # restarted into incarnation 3
    split = {"job-p-n0": obs(10.0, instance_id_for("job-p", 2), [ES.NORMAL] * 2),
             "job-p-n1": obs(10.0, instance_id_for("job-p", 4), [ES.NORMAL] * 2)}
    _, p = step(world(nodes=two_nodes(), observations=split))
    assert list(p.upserts) == [IID] and p.incarnations == {}


# --- static stability: an instance whose node is lost stays routable for node_lost_routing_grace ---
def one_node_active(grace: float = 300.0, paused: bool = False) -> World:
    nodes = {"job-p-n0": record(spec(0, 1), 9.0)}
    w, _ = step(world(nodes=nodes, node_lost_routing_grace=grace))
    w, _ = step(replace(w, observations={"job-p-n0": obs(10.0, 0, [], NodeState.REGISTERED)}))
    w, _ = step(replace(w, observations={"job-p-n0": obs(10.5, IID, [ES.NORMAL] * 2)}, now=10.6))
    assert w.instances[IID].state is InstanceState.ACTIVE and w.instances[IID].routable_until == 0.0
    if paused:
        w = replace(w, instances={IID: replace(w.instances[IID], paused=True)})
    return w


def lost(w: World, now: float = 14.0, wall: float = 2000.0) -> tuple[World, Plan]:
    """The node's last heartbeat (10.5) is older than the 3 s timeout at *now*."""
    return step(replace(w, now=now, wall=wall))


def test_a_node_loss_stamps_routable_until_wall_plus_grace_and_its_return_clears_it() -> None:
    w, p = lost(one_node_active())
    mi = w.instances[IID]
    assert mi.state is InstanceState.INACTIVE and p.signals[IID] is Signal.NODE_LOST
    assert mi.routable_until == 2300.0 and "job-p-n0" in mi.reason
    w, p = lost(w, now=20.0, wall=2006.0)  # still lost: nothing rewritten, the deadline stays
    assert p.upserts == {} and w.instances[IID].routable_until == 2300.0
    back = {"job-p-n0": obs(20.5, IID, [ES.NORMAL] * 2)}  # the nodemanager is back (adopted its engines)
    w, p = step(replace(w, observations=back, now=20.6, wall=2007.0))
    assert w.instances[IID].state is InstanceState.ACTIVE and w.instances[IID].routable_until == 0.0


def test_a_node_back_with_another_verdict_clears_routable_until_and_a_new_loss_does_not_restore_it() -> None:
    w, _ = lost(one_node_active())
    abnormal = {"job-p-n0": obs(20.5, IID, [ES.ABNORMAL, ES.NORMAL])}
    w, p = step(replace(w, observations=abnormal, now=20.6, wall=2007.0))
    assert p.signals[IID] is Signal.ABNORMAL and w.instances[IID].state is InstanceState.INACTIVE
    assert w.instances[IID].routable_until == 0.0 and IID in p.upserts  # persisted
    w, p = lost(w, now=30.0, wall=2017.0)  # lost again while INACTIVE: no transition, not routable
    assert p.signals[IID] is Signal.NODE_LOST and w.instances[IID].routable_until == 0.0


def test_a_restarted_nodemanager_coming_back_to_its_instance_keeps_routable_until_until_it_is_active() -> None:
    w, _ = lost(one_node_active())
    # re-registered (a new process: no heartbeat yet), then REGISTERED/RESTORED until the start command
    # adopts the engines its predecessor left serving: kept, the start command goes out
    w, p = step(replace(w, nodes={"job-p-n0": record(spec(0, 1), 20.0)}, observations={}, now=20.1, wall=2007.0))
    assert p.signals[IID] is Signal.PENDING and w.instances[IID].routable_until == 2300.0 and p.upserts == {}
    for state in (NodeState.REGISTERED, NodeState.RESTORED):
        back = {"job-p-n0": obs(20.5, 0, [], state)}
        w2, p = step(replace(w, observations=back, now=20.6, wall=2007.0))
        assert p.signals[IID] is Signal.PENDING and w2.instances[IID].routable_until == 2300.0
        assert [c.node_id for c in p.starts] == ["job-p-n0"]
    # the start command went out: it (re)starts the instance, its first health probe not yet passed
    # (an adopted engine passes it at once; the coordinators' probes judge the engines meanwhile)
    for starting in (obs(20.8, IID, [], NodeState.STARTING), obs(20.8, IID, [ES.INITIAL] * 2)):
        w3, p = step(replace(w2, observations={"job-p-n0": starting}, now=20.9, wall=2007.5))
        assert p.signals[IID] is Signal.PENDING and w3.instances[IID].routable_until == 2300.0, starting
    # adopted: ACTIVE, cleared
    adopted = {"job-p-n0": obs(21.0, IID, [ES.NORMAL] * 2)}
    w3, _ = step(replace(w3, observations=adopted, now=21.1, wall=2008.0))
    assert w3.instances[IID].state is InstanceState.ACTIVE and w3.instances[IID].routable_until == 0.0
    # back running another instance: cleared, not kept (as with ABNORMAL endpoints or stopping)
    for other in (obs(21.0, 77, [ES.NORMAL] * 2), obs(21.0, 77, [], NodeState.STARTING)):
        w4, p = step(replace(w2, observations={"job-p-n0": other}, now=21.1, wall=2008.0))
        assert p.signals[IID] is Signal.PENDING and w4.instances[IID].routable_until == 0.0, other
    stopping = {"job-p-n0": obs(21.0, IID, [ES.NORMAL] * 2, NodeState.STOPPING)}
    w4, p = step(replace(w2, observations=stopping, now=21.1, wall=2008.0))
    assert p.signals[IID] is Signal.ABNORMAL and w4.instances[IID].routable_until == 0.0


def test_nodes_back_with_new_ports_refresh_the_instance_and_clear_routable_until() -> None:
    w, _ = lost(one_node_active())
    moved = spec(0, 1, base_port=9000)  # other engines: the old ones were not adopted
    w, p = step(replace(w, nodes={"job-p-n0": record(moved, 20.0)}, observations={"job-p-n0": obs(20.0, 0, [], NodeState.REGISTERED)},
                        now=20.1, wall=2007.0))
    mi = w.instances[IID]
    assert mi.generation == 2 and mi.routable_until == 0.0 and [c.node_id for c in p.starts] == ["job-p-n0"]


def test_no_routable_until_with_the_grace_off_when_operator_paused_or_for_another_cause() -> None:
    assert lost(one_node_active(grace=0.0))[0].instances[IID].routable_until == 0.0
    assert lost(one_node_active(paused=True))[0].instances[IID].routable_until == 0.0
    w = one_node_active()
    abnormal = {"job-p-n0": obs(13.9, IID, [ES.ABNORMAL, ES.NORMAL])}
    w, _ = step(replace(w, observations=abnormal, now=14.0))
    assert w.instances[IID].state is InstanceState.INACTIVE and w.instances[IID].routable_until == 0.0


def test_a_restarted_controller_keeps_routable_until_while_the_fleet_re_attaches() -> None:
    w, _ = lost(one_node_active())
    loaded = {n: replace(r, registered_mono=None) for n, r in w.nodes.items()}
    r = world(nodes=loaded, instances=w.instances, now=100.0, wall=2050.0, reattach_until=109.0,
              node_lost_routing_grace=300.0)
    r, p = step(r)
    assert p.signals[IID] is Signal.UNKNOWN and p.upserts == {} and r.instances[IID].routable_until == 2300.0
    r, p = step(replace(r, now=109.0))
    assert p.signals[IID] is Signal.NODE_LOST and p.upserts == {} and r.instances[IID].routable_until == 2300.0


def test_a_displaced_lost_node_retires_the_instance_and_clears_routable_until() -> None:
    w, _ = lost(one_node_active())
    nodes = {"pod-new": record(spec(0, 1, node_id="pod-new"), 14.0)}
    w, _ = step(replace(w, nodes=nodes))
    assert w.instances[IID].state is InstanceState.DELETED and w.instances[IID].routable_until == 0.0
