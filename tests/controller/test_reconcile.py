from __future__ import annotations

from dataclasses import replace

from motor_common.domain import EndpointStatus as ES
from motor_controller.assembly import instance_id_for
from motor_controller.model import Capabilities, InstanceState, NodeState
from motor_controller.reconcile import Plan, World, plan
from tests.controller.factories import obs, record, spec


def world(**kw: object) -> World:
    base: dict[str, object] = dict(
        nodes={}, observations={}, instances={}, incarnations={}, start_gates={}, now=10.0, wall=1000.0,
        started_at=0.0, heartbeat_timeout=3.0, master_port=29550,
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
    r = world(nodes=loaded, instances=w.instances, now=100.0, started_at=100.0)
    r, p = step(r)
    assert p.starts == [] and p.upserts == {}  # UNKNOWN within grace: nothing moves
    r, p = step(replace(r, now=100.5, observations={n: obs(100.5, IID, [ES.NORMAL] * 2) for n in loaded}))
    assert p.starts == [] and r.instances[IID].state is InstanceState.ACTIVE


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
