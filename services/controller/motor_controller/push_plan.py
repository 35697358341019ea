"""Event-pusher planning (pure): desired coordinator view vs last synced view → operations.

Per coordinator the pusher keeps a :class:`SyncState`. Rules (SPEC §5, seed "最终一致性兜底"):

- increments (DEL, ADD, PAUSE, RESUME) are planned from the diff; each is stamped with the next
  generation (the coordinator accepts exactly current + 1);
- a failed increment sets ``full_set_pending`` (one coalesced full SET, however many failed) and
  drops the rest of the batch;
- a failed SET is not re-enqueued recursively: it stays pending but is retried no sooner than
  ``set_retry_at``, and the last-synced view and fingerprint do not move;
- the periodic full sync compares the coordinator's own list and generation with what we believe
  is synced (:func:`check`), and any difference (restart, foreign writes) makes a full SET pending;
- an instance the controller has no record of is not taken away from a coordinator while the
  controller may not know the fleet yet (``hold``: true for such ids during its re-attach grace
  after a start or an election; an empty or new store, a lost SQLite file): a SET keeps it (last
  listed or last synced) unless a desired instance replaces it (same id, or one of its engines),
  and no DEL is sent for it. The removals follow once the grace is over, when the fleet has had its
  chance to re-attach (:func:`held_view`). Instances the controller knows are removed as always.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from motor_common.domain import Instance, InstanceStatus
from motor_controller.instance_fsm import Signal
from motor_controller.model import InstanceState, ManagedInstance
from motor_controller.scale_down import visible

View = Mapping[int, Instance]


class OpKind(enum.Enum):
    SET = "set"
    DEL = "delete"
    ADD = "add"
    PAUSE = "pause"
    RESUME = "resume"


@dataclass(frozen=True)
class Op:
    kind: OpKind
    instances: tuple[Instance, ...]
    generation: int


@dataclass(frozen=True)
class SyncState:
    generation: int = 0  # last generation the coordinator confirmed (persisted)
    synced: View | None = None  # None = unknown: check or SET first
    fingerprint: str = ""
    full_set_pending: bool = False
    set_retry_at: float = 0.0
    listed: View | None = None  # the coordinator's own list at the last check (None = not listed yet)


def kept_without_node(mi: ManagedInstance, signal: Signal | None, wall: float) -> bool:
    """*mi* is INACTIVE because a node of it was lost and still within its routing grace
    (``routable_until``, set by the reconcile plan): coordinators keep routing to it, the data plane
    judges its engines (static stability). Its signal must still be NODE_LOST; UNKNOWN (a restarted
    controller waiting for the fleet to re-attach), None (not observed yet by this process) or
    PENDING (its restarted nodemanager is on its way to running it: the start command adopts the
    engines its predecessor left serving) keep it too: the plan clears ``routable_until`` as soon as a node of it is heard from with another
    verdict (``reconcile.rejoining``)."""
    return (mi.state is InstanceState.INACTIVE and wall < mi.routable_until
            and signal in (Signal.NODE_LOST, Signal.UNKNOWN, Signal.PENDING, None))


def desired_view(instances: Iterable[ManagedInstance], signals: Mapping[int, Signal], *,
                 wall: float) -> dict[int, Instance]:
    """ACTIVE instances (PAUSED when an operator paused them or their endpoints are paused),
    RECOVERING ones as PAUSED, and INACTIVE ones whose node was lost within their routing grace
    (:func:`kept_without_node`; *wall* is the wall clock) as ACTIVE ones are."""
    out: dict[int, Instance] = {}
    for mi in instances:
        if mi.instance is None:
            continue
        if mi.state is InstanceState.ACTIVE or kept_without_node(mi, signals.get(mi.id), wall):
            paused = mi.paused or signals.get(mi.id) is Signal.PAUSED
        elif mi.state is InstanceState.RECOVERING:
            paused = True
        else:
            continue
        status = InstanceStatus.PAUSED if paused else InstanceStatus.AVAILABLE
        out[mi.id] = replace(visible(mi.instance, mi.withdrawn_dp_ranks), status=status)
    return out


def _content(inst: Instance) -> tuple[object, ...]:
    eps = tuple(sorted((e.id, e.ip, e.business_port, e.bootstrap_port, e.kv_port, e.dp_rank, e.kv_events_port,
                        e.kv_events_replay_port) for e in inst.endpoints))
    return (inst.id, inst.role.value, inst.job_name, inst.model_name, inst.engine_type.value, eps)


def _paused(inst: Instance) -> bool:
    return inst.status is InstanceStatus.PAUSED


def fingerprint(view: View) -> str:
    h = hashlib.sha256()
    for iid in sorted(view):
        h.update(repr((_content(view[iid]), _paused(view[iid]))).encode())
    return h.hexdigest()


def _engines(inst: Instance) -> set[tuple[str, int]]:
    return {(e.ip, e.business_port) for e in inst.endpoints}


def held_view(desired: View, held: View) -> dict[int, Instance]:
    """*desired* plus every instance of *held* (what a coordinator holds) that no desired instance
    replaces: not the same id and none of the same engines (an engine serves one instance)."""
    out = dict(desired)
    taken = {engine for inst in desired.values() for engine in _engines(inst)}
    for iid in sorted(held):
        if iid not in out and not _engines(held[iid]) & taken:
            out[iid] = held[iid]
    return out


def _never(iid: int) -> bool:
    return False


def plan_ops(state: SyncState, desired: View, now: float, *, hold: Callable[[int], bool] = _never) -> list[Op]:
    """Operations that bring the coordinator from ``state.synced`` to *desired*, never taking away
    an instance whose id *hold* names."""
    if state.synced is None or state.full_set_pending:
        if now < state.set_retry_at:
            return []
        held = {iid: i for iid, i in {**(state.synced or {}), **(state.listed or {})}.items() if hold(iid)}
        view = held_view(desired, held) if held else desired
        return [Op(OpKind.SET, tuple(view[i] for i in sorted(view)), state.generation + 1)]
    synced = state.synced
    dels: list[Instance] = []
    adds: list[Instance] = []
    pauses: list[Instance] = []
    resumes: list[Instance] = []
    for iid in sorted(synced):
        if iid not in desired:
            if not hold(iid):
                dels.append(synced[iid])
        elif _content(synced[iid]) != _content(desired[iid]):
            dels.append(synced[iid])  # replaced by its new content (the ADD below), not removed
    for iid in sorted(desired):
        want = desired[iid]
        have = synced.get(iid)
        if have is None or _content(have) != _content(want):
            adds.append(want)
        elif _paused(have) != _paused(want):
            (pauses if _paused(want) else resumes).append(want)
    ops: list[Op] = []
    gen = state.generation
    for kind, batch in ((OpKind.DEL, dels), (OpKind.ADD, adds), (OpKind.PAUSE, pauses), (OpKind.RESUME, resumes)):
        if batch:
            gen += 1
            ops.append(Op(kind, tuple(batch), gen))
    return ops


def after_success(state: SyncState, op: Op, generation: int) -> SyncState:
    """The coordinator applied *op* and reports *generation*."""
    if op.kind is OpKind.SET:
        view = {i.id: i for i in op.instances}
        return SyncState(generation, view, fingerprint(view), False, 0.0)
    assert state.synced is not None
    view = dict(state.synced)
    for inst in op.instances:
        if op.kind is OpKind.DEL:
            view.pop(inst.id, None)
        elif op.kind is OpKind.ADD:
            view[inst.id] = inst
        elif op.kind is OpKind.PAUSE:
            view[inst.id] = replace(view[inst.id], status=InstanceStatus.PAUSED)
        else:
            view[inst.id] = replace(view[inst.id], status=InstanceStatus.AVAILABLE)
    return replace(state, generation=generation, synced=view, fingerprint=fingerprint(view))


def after_failure(state: SyncState, op: Op, now: float, set_retry_interval: float) -> SyncState:
    """*op* failed: an increment enqueues one coalesced SET; a failed SET only waits to retry."""
    if op.kind is OpKind.SET:
        return replace(state, full_set_pending=True, set_retry_at=now + set_retry_interval)
    return replace(state, full_set_pending=True)


def check(state: SyncState, coordinator_generation: int, coordinator_view: View) -> SyncState:
    """Compare the coordinator's own list with what we believe is synced (periodic full sync).

    An unknown state adopts the coordinator's list when its generation is the one we persisted
    (a restarted controller need not SET); any mismatch makes a full SET pending, stamped above
    the higher of both generations.
    """
    theirs = fingerprint(coordinator_view)
    generation = max(state.generation, coordinator_generation)
    listed = dict(coordinator_view)
    if state.synced is None:
        if coordinator_generation == state.generation and coordinator_generation > 0:
            return SyncState(generation, listed, theirs, state.full_set_pending, state.set_retry_at, listed)
        return replace(state, generation=generation, full_set_pending=True, listed=listed)
    if coordinator_generation != state.generation or theirs != state.fingerprint:
        return replace(state, generation=generation, full_set_pending=True, listed=listed)
    return state  # in sync: the coordinator holds what we synced


def unknown_history(state: SyncState, coordinator_generation: int, coordinator_view: View) -> bool:
    """The coordinator holds instances from a history this controller has no record of: it never
    confirmed a generation of this coordinator (an empty or new store) yet the coordinator is past 0."""
    return state.synced is None and state.generation == 0 and coordinator_generation > 0 and bool(coordinator_view)
