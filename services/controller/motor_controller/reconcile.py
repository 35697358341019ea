"""The reconcile plan (pure): whole observed + desired state in, a plan out.

The controller's loop calls :func:`plan` on a schedule (and when poked), then applies the plan.
The plan never depends on what woke the loop; deterministic instance ids make a retried apply
a no-op. Steps:

1. *Assemble*: a job with no live instance and all ranks registered and alive gets one (or a
   fail-closed INITIAL record with the reason); a still-INITIAL blocked record is re-assembled.
2. *Validate*: a live instance whose nodes were displaced or whose specs changed is retired
   (DELETED, the job's incarnation bumped so the next assembly gets a new id) — except when the same
   node ids re-registered with other ports (restarted nodemanagers with stable ids): the instance keeps
   its id and is refreshed in place (generation + 1) once all its nodes are alive; until then nothing
   of it is started.
3. *Observe*: every live instance's signal moves its state through ``instance_fsm``. An instance
   that goes ACTIVE --NODE_LOST--> INACTIVE (not operator-paused) is stamped ``routable_until`` =
   wall + ``node_lost_routing_grace`` (static stability: the coordinators keep routing to it, see
   ``push_plan.kept_without_node``); any other transition, or any signal of it but NODE_LOST or
   UNKNOWN while INACTIVE, clears it — except PENDING while the lost nodes come back and start it
   again (a restarted nodemanager's start command adopts the engines its predecessor left serving:
   :func:`rejoining`).
4. *Start*: a fresh node whose heartbeat shows it is not running its instance gets StartEngines
   (rate-limited per node; never for nodes without a heartbeat since registration/restart).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from motor_common.domain import Instance, NodeSpec
from motor_controller.assembly import StartCommand, assemble, instance_id_for, start_commands
from motor_controller.instance_fsm import Signal, observe, observe_node, transition
from motor_controller.model import (
    InstanceState,
    ManagedInstance,
    NodeObservation,
    NodeRecord,
    NodeState,
)


@dataclass(frozen=True)
class World:
    nodes: Mapping[str, NodeRecord]
    observations: Mapping[str, NodeObservation]
    instances: Mapping[int, ManagedInstance]
    incarnations: Mapping[str, int]
    # node id -> (instance id, monotonic time before which no new start is sent)
    start_gates: Mapping[str, tuple[int, float]]
    now: float  # monotonic
    wall: float
    # Monotonic end of this controller's re-attach grace (its start or election + the grace): until
    # then a node loaded from the store that has not heartbeated yet is UNKNOWN, never lost.
    reattach_until: float
    heartbeat_timeout: float
    master_port: int
    # ACTIVE --NODE_LOST--> INACTIVE keeps the instance routable this long (wall seconds; 0 = off).
    node_lost_routing_grace: float = 0.0


@dataclass
class Plan:
    upserts: dict[int, ManagedInstance] = field(default_factory=dict)
    incarnations: dict[str, int] = field(default_factory=dict)
    starts: list[StartCommand] = field(default_factory=list)
    signals: dict[int, Signal] = field(default_factory=dict)
    # instance id -> surviving node ids of an instance that lost some (not all) of its nodes
    partial_losses: dict[int, tuple[str, ...]] = field(default_factory=dict)


def node_alive(rec: NodeRecord, ob: NodeObservation | None, now: float, timeout: float) -> bool:
    if ob is not None and now - ob.seen_at < timeout:
        return True
    return ob is None and rec.registered_mono is not None and now - rec.registered_mono < timeout


_NOT_RUNNING = (NodeState.STOPPING, NodeState.REGISTERED, NodeState.RESTORED)


def partial_loss(mi: ManagedInstance, world: World) -> tuple[str, ...]:
    """Surviving nodes of a multi-node instance that lost some but not all of its nodes (else ())."""
    if len(mi.node_ids) < 2 or mi.state not in (InstanceState.STARTING, InstanceState.ACTIVE, InstanceState.INACTIVE):
        return ()
    lost, survivors = [], []
    for node_id in mi.node_ids:
        rec = world.nodes.get(node_id)
        ob = world.observations.get(node_id)
        if ob is None and rec is not None and rec.registered_mono is None and world.now < world.reattach_until:
            # loaded from the store and not re-attached yet (re-attach grace): nothing is known of it,
            # so the instance is not judged; nodes heard from since the start are judged as usual
            return ()
        if rec is None or not node_alive(rec, ob, world.now, world.heartbeat_timeout):
            lost.append(node_id)
        elif ob is not None and ob.instance_id == mi.id and ob.state not in _NOT_RUNNING:
            survivors.append(node_id)  # still runs engines of the instance: must be restarted with it
    return tuple(survivors) if lost and survivors else ()


_AWAITING_START = (NodeState.REGISTERED, NodeState.RESTORED)


def rejoining(mi: ManagedInstance, world: World) -> bool:
    """Every node of *mi* is lost, re-attaching, healthy, or back and on its way to running *mi*
    again: waiting for its first heartbeat or its start command (REGISTERED/RESTORED), or running
    *mi* with endpoints not all NORMAL yet (a restarted nodemanager adopts the engines its predecessor
    left serving when the start command comes; its first health probe follows). Nothing says its
    engines stopped serving: that is the coordinators' call (their readiness probes), as while the
    node was lost. A node stopping, with an ABNORMAL endpoint or running another instance is not."""
    for node_id in mi.node_ids:
        ob = world.observations.get(node_id)
        sig, _ = observe_node(mi, node_id, world.nodes.get(node_id), ob, world.now, world.heartbeat_timeout,
                               world.reattach_until)
        if sig in (Signal.NODE_LOST, Signal.UNKNOWN, Signal.HEALTHY, Signal.PAUSED):
            continue
        if sig is Signal.PENDING and (ob is None or ob.state in _AWAITING_START or ob.instance_id == mi.id):
            continue  # re-registered: its first heartbeat, the start command or the adoption is under way
        return False
    return True


def rejoinable(mi: ManagedInstance, instance: Instance | None, node_ids: tuple[str, ...], reason: str) -> bool:
    """The same nodes (ids, ranks, roles) re-assemble *mi* with other endpoints (ports): a restarted
    nodemanager with a stable node id. Anything else (other nodes, a failed assembly) retires it."""
    if instance is None or reason or mi.instance is None or node_ids != mi.node_ids:
        return False
    old = mi.instance
    return (instance.id, instance.role, instance.job_name, instance.model_name, instance.engine_type) == (
        old.id, old.role, old.job_name, old.model_name, old.engine_type,
    ) and len(instance.endpoints) == len(old.endpoints)


# How many incarnations past the one it knows the controller looks for what a job's nodes run.
INCARNATION_SEARCH = 1000


def running_incarnation(job: str, specs: list[NodeSpec], world: World, known: int) -> int | None:
    """The incarnation of *job* its nodes run, when it is later than *known* (this controller's
    record; 0 and none after its store was lost): every node of the job heard from lately, running
    something, runs the same instance, whose id is the job's for an incarnation in ``(known, known +
    INCARNATION_SEARCH]``. None otherwise — nodes that run nothing, or an older incarnation (a
    retired instance's nodes not restarted yet), or disagree, never move the controller's record."""
    ids = set()
    for sp in specs:
        ob = world.observations.get(sp.node_id)
        if ob is None or world.now - ob.seen_at >= world.heartbeat_timeout:
            continue
        if ob.state in (NodeState.REGISTERED, NodeState.RESTORED, NodeState.STOPPING) or not ob.instance_id:
            continue
        ids.add(ob.instance_id)
    if len(ids) != 1:
        return None
    (iid,) = ids
    if iid == instance_id_for(job, known):
        return None
    for k in range(known + 1, known + INCARNATION_SEARCH + 1):
        if instance_id_for(job, k) == iid:
            return k
    return None


def _set_state(mi: ManagedInstance, state: InstanceState, reason: str, wall: float,
               routable_until: float = 0.0) -> ManagedInstance:
    """*mi* moved to *state*; every transition clears ``routable_until`` unless it sets a new one."""
    return replace(mi, state=state, reason=reason, state_changed_at=wall, routable_until=routable_until)


def routable_until(mi: ManagedInstance, nxt: InstanceState, sig: Signal, world: World) -> float:
    """When *mi* moving to *nxt* on *sig* leaves routing: wall + grace for an ACTIVE instance whose
    node was lost (not operator-paused, the grace on), else 0 (at once)."""
    if (mi.state is InstanceState.ACTIVE and nxt is InstanceState.INACTIVE and sig is Signal.NODE_LOST
            and not mi.paused and world.node_lost_routing_grace > 0):
        return world.wall + world.node_lost_routing_grace
    return 0.0


def plan(world: World) -> Plan:
    out = Plan()
    now, timeout = world.now, world.heartbeat_timeout
    instances = dict(world.instances)
    incarnations = dict(world.incarnations)

    def put(mi: ManagedInstance) -> None:
        instances[mi.id] = mi
        out.upserts[mi.id] = mi

    alive_by_job: dict[str, list[NodeSpec]] = {}
    alive_ids: set[str] = set()
    for node_id, rec in world.nodes.items():
        ob = world.observations.get(node_id)
        if node_alive(rec, ob, now, timeout) and (ob is None or ob.state is not NodeState.STOPPING):
            alive_by_job.setdefault(rec.spec.job_name, []).append(rec.spec)
            alive_ids.add(node_id)
    live_by_job: dict[str, ManagedInstance] = {}
    for mi in instances.values():
        if mi.live:
            live_by_job[mi.job_name] = mi

    # 2. retire live instances whose nodes no longer match what they were assembled from; a node
    #    that re-registered under the same id with other ports (a restarted nodemanager) rejoins:
    #    the instance keeps its id and is refreshed in place once every node of it is alive (its
    #    engines are new ones, on the new ports: nothing of it is kept in routing without its node).
    stale: set[int] = set()
    for job, mi in list(live_by_job.items()):
        if mi.blocked:
            continue
        specs = [world.nodes[n].spec for n in mi.node_ids if n in world.nodes]
        again = (
            assemble(job, specs, mi.incarnation, world.master_port)
            if len(specs) == len(mi.node_ids)
            else None
        )
        if again is not None and again.instance == mi.instance and again.master_address == mi.master_address:
            continue
        if again is not None and rejoinable(mi, again.instance, again.node_ids, again.reason):
            if all(n in alive_ids for n in mi.node_ids):
                mi = replace(mi, instance=again.instance, master_address=again.master_address,
                             generation=mi.generation + 1, reason="nodes rejoined with new endpoints",
                             state_changed_at=world.wall, routable_until=0.0)  # fmt: skip
                put(mi)
                live_by_job[job] = mi
            else:
                stale.add(mi.id)  # wait for every node before starting anything
            continue
        why = "nodes changed: " + (again.reason if again and again.reason else "re-registered with another spec")
        put(_set_state(mi, InstanceState.DELETED, why, world.wall))
        incarnations[job] = mi.incarnation + 1
        out.incarnations[job] = mi.incarnation + 1
        del live_by_job[job]

    # 1. assemble jobs without a live instance; refresh blocked INITIAL records. A job whose nodes
    #    run a later incarnation than this controller knows (its store was lost) gets that one back.
    for job, specs in alive_by_job.items():
        current = live_by_job.get(job)
        inc = incarnations.get(job, 0)
        unstarted = current is None or current.state is InstanceState.INITIAL
        later = running_incarnation(job, specs, world, inc) if unstarted else None
        if later is not None:
            if current is not None:
                put(_set_state(current, InstanceState.DELETED,
                               f"superseded: its nodes run incarnation {later} of the job", world.wall))  # fmt: skip
                del live_by_job[job]
                current = None
            inc = incarnations[job] = out.incarnations[job] = later
        if current is not None and not (current.blocked and current.state is InstanceState.INITIAL):
            continue
        result = assemble(job, specs, inc, world.master_port)
        if result is None:
            continue
        mi = ManagedInstance(
            id=result.instance_id,
            job_name=job,
            incarnation=inc,
            state=InstanceState.INITIAL,
            instance=result.instance,
            node_ids=result.node_ids,
            master_address=result.master_address,
            state_changed_at=world.wall,
            reason=result.reason or "assembled",
        )
        if current is not None and (current.instance, current.node_ids, current.reason, current.id) == (
            mi.instance, mi.node_ids, mi.reason, mi.id,
        ):
            continue
        put(mi)
        live_by_job[job] = mi

    # 3 + 4. observe, transition, start.
    for mi in list(live_by_job.values()):
        if mi.blocked:
            continue
        sig, why = observe(mi, world.nodes, world.observations, now, timeout, world.reattach_until)
        out.signals[mi.id] = sig
        nxt = transition(mi.state, sig)
        if nxt is not None:
            mi = _set_state(mi, nxt, why, world.wall, routable_until(mi, nxt, sig, world))
            put(mi)
        elif mi.routable_until and (
            mi.state is not InstanceState.INACTIVE
            or sig not in (Signal.NODE_LOST, Signal.UNKNOWN, Signal.PENDING)
            or (sig is Signal.PENDING and not rejoining(mi, world))
        ):
            # its node came back with another verdict (ABNORMAL, stopping, starting other engines,
            # …): routing is the usual again, and a later loss of it does not bring it back into routing
            mi = replace(mi, routable_until=0.0)
            put(mi)
        survivors = partial_loss(mi, world)
        if survivors:
            out.partial_losses[mi.id] = survivors
        if mi.state in (InstanceState.RECOVERING, InstanceState.DELETED, InstanceState.ACTIVE) or mi.id in stale:
            continue
        assert mi.instance is not None
        specs = [world.nodes[n].spec for n in mi.node_ids]
        commands = start_commands(mi.instance, specs, mi.master_address, world.master_port, mi.generation)
        dispatched = 0
        for node_id, cmd in commands.items():
            ob = world.observations.get(node_id)
            if ob is None or now - ob.seen_at >= timeout:
                continue  # no evidence yet: wait for a heartbeat (never re-launch blindly)
            running = ob.instance_id == mi.id and ob.state not in (NodeState.REGISTERED, NodeState.RESTORED)
            if running or ob.state is NodeState.STOPPING:
                dispatched += running
                continue
            gate = world.start_gates.get(node_id)
            if gate is not None and gate[0] == mi.id and now < gate[1]:
                dispatched += 1
                continue
            out.starts.append(cmd)
            dispatched += 1
        if mi.state is InstanceState.INITIAL and dispatched == len(commands):
            nxt = transition(mi.state, Signal.START_DISPATCHED)
            if nxt is not None:
                put(_set_state(mi, nxt, "start commands dispatched", world.wall))
    return out


def deleted_to_forget(instances: Mapping[int, ManagedInstance], keep: int) -> list[int]:
    """Ids of DELETED instance records beyond the *keep* most recently deleted: a deleted record is
    history (GetInstance answers DELETED), kept bounded so a long-running controller does not grow
    with every terminate, recovery or displacement (each loop walks every record)."""
    deleted = [mi for mi in instances.values() if mi.state is InstanceState.DELETED]
    if len(deleted) <= keep:
        return []
    deleted.sort(key=lambda mi: (mi.state_changed_at, mi.id))
    return [mi.id for mi in deleted[:len(deleted) - keep]]
