"""The instance registry as pure state transitions (no I/O, no clock).

Every operation takes the current :class:`RegistryState` and returns a new one (or raises a
``MotorError`` and leaves the caller's state untouched). The servicer commits the new state only
after the scheduler accepted it, with no ``await`` in between.

Errors:
    InvalidArgument     bad instance, duplicate id/endpoint inside one request, bad page token
    AlreadyExists       ADD of an id registered with another identity, or of an endpoint that
                        another instance already serves (reason ENDPOINT_IN_USE)
    NotFound            DELETE/PAUSE/RESUME/GET of an unknown id
    InvalidArgument     also: a generation above MAX_GENERATION (GENERATION_OUT_OF_RANGE)
    FailedPrecondition  DELETE whose role, job name or endpoint group differs from the registered
                        instance (reason IDENTITY_MISMATCH); generation gap (GENERATION_GAP); the
                        next generation would exceed MAX_GENERATION (GENERATION_EXHAUSTED); an
                        untracked PAUSE/RESUME on a controller-managed registry (MANAGED_BY_CONTROLLER)
    Aborted             stale generation (STALE_GENERATION); an untracked write made for another
                        generation (GENERATION_CHANGED, ``if_generation``)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from motor_common.domain import Instance, InstanceStatus, Role, normalize_ip
from motor_common.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from motor_common.request_limits import MAX_GENERATION
from motor_coordinator.validation import validate_batch

DEFAULT_PAGE_SIZE = 1000
MAX_PAGE_SIZE = 1000
# Highest generation the registry accepts or reaches: MAX_GENERATION = 2^53 - 1 (exact in every JSON
# client, and far below the uint64 wire limit, so ``generation + 1`` can always be encoded in a
# response); the chassis refuses a higher one in any request before a handler runs.


@dataclass(frozen=True)
class RegistryState:
    generation: int = 0
    instances: Mapping[int, Instance] = field(default_factory=lambda: MappingProxyType({}))
    # False until the first accepted SET or ADD (see :func:`authoritative_after`): until then the
    # coordinator does not know the fleet, so "model not found" would be a guess (Dispatch answers
    # UNAVAILABLE REGISTRY_NOT_SYNCED instead).
    authoritative: bool = False
    # True once a controller-stamped write (generation > 0) was applied: the controller then owns
    # the instance set and re-pushes it, so an operator's untracked (generation 0) pause or resume
    # would be undone by its next push and is refused (:func:`pause_instances`).
    managed: bool = False

    def get(self, instance_id: int) -> Instance:
        try:
            return self.instances[instance_id]
        except KeyError:
            raise NotFound(
                f"instance {instance_id} is not registered",
                reason="INSTANCE_NOT_FOUND",
                metadata={"instance_id": str(instance_id)},
            ) from None


def _state(generation: int, instances: Mapping[int, Instance], authoritative: bool,
           managed: bool) -> RegistryState:
    return RegistryState(generation, MappingProxyType(dict(instances)), authoritative, managed)


# -- generations ------------------------------------------------------------------------------


def _bounded(current: int, requested: int) -> int:
    """*requested*, or ``current + 1`` for 0, checked against :data:`MAX_GENERATION`."""
    if requested > MAX_GENERATION or requested < 0:
        raise InvalidArgument(
            f"generation {requested} is out of range: use 0 (not tracked) or 1..{MAX_GENERATION}",
            reason="GENERATION_OUT_OF_RANGE",
            metadata={"requested_generation": str(requested), "max_generation": str(MAX_GENERATION)},
        )
    if requested == 0 and current >= MAX_GENERATION:
        raise FailedPrecondition(
            f"the coordinator is at the highest generation {current}; restart it to start again from 0",
            reason="GENERATION_EXHAUSTED",
            metadata={"current_generation": str(current)},
        )
    return current + 1 if requested == 0 else requested


def next_generation_for_set(current: int, requested: int) -> int:
    requested = _bounded(current, requested)
    if requested < current:
        raise Aborted(
            f"stale generation {requested}: the coordinator is at generation {current}",
            reason="STALE_GENERATION",
            metadata={"current_generation": str(current), "requested_generation": str(requested)},
        )
    return requested


def next_generation_for_increment(current: int, requested: int) -> int:
    requested = _bounded(current, requested)
    if requested <= current:
        raise Aborted(
            f"stale generation {requested}: the coordinator is at generation {current}; "
            f"an incremental update needs exactly {current + 1}",
            reason="STALE_GENERATION",
            metadata={"current_generation": str(current), "requested_generation": str(requested)},
        )
    if requested > current + 1:
        raise FailedPrecondition(
            f"generation gap: the coordinator is at generation {current}, got {requested}; "
            "send a full SetInstances",
            reason="GENERATION_GAP",
            metadata={"current_generation": str(current), "requested_generation": str(requested)},
        )
    return requested


def check_if_generation(current: int, if_generation: int | None, generation: int) -> None:
    """An untracked caller's condition (``if_generation``): the write applies only at exactly that
    generation. It cannot be combined with a tracked ``generation``."""
    if if_generation is None:
        return
    if generation != 0:
        raise InvalidArgument(
            "if_generation is for calls without a generation (generation 0); a tracked caller's "
            "generation already orders its writes",
            reason="CONFLICTING_GENERATIONS",
            metadata={"requested_generation": str(generation), "if_generation": str(if_generation)},
        )
    if if_generation != current:
        raise Aborted(
            f"the instance set changed: the coordinator is at generation {current}, the call was "
            f"made for generation {if_generation}; list the instances again and retry",
            reason="GENERATION_CHANGED",
            metadata={"current_generation": str(current), "if_generation": str(if_generation)},
        )


# -- mutations ------------------------------------------------------------------------------


def _registered(inst: Instance) -> Instance:
    status = InstanceStatus.PAUSED if inst.status is InstanceStatus.PAUSED else InstanceStatus.AVAILABLE
    return replace(inst, status=status)


def set_instances(state: RegistryState, instances: Sequence[Instance], generation: int) -> RegistryState:
    gen = next_generation_for_set(state.generation, generation)
    validate_batch(instances)
    return _state(gen, {i.id: _registered(i) for i in instances}, True, state.managed or generation > 0)


def _describe_identity_diff(registered: Instance, given: Instance) -> str:
    parts = []
    if registered.role is not given.role:
        parts.append(f"role {given.role.value} != registered {registered.role.value}")
    if registered.job_name != given.job_name:
        parts.append(f"job name {given.job_name!r} != registered {registered.job_name!r}")
    if registered.endpoint_group() != given.endpoint_group():
        mine = ", ".join(sorted(e.host_port for e in registered.endpoints))
        parts.append(f"endpoint group differs (registered: {mine})")
    return "; ".join(parts)


def add_instances(
    state: RegistryState, instances: Sequence[Instance], generation: int
) -> tuple[RegistryState, list[int]]:
    """Returns the new state and the ids that were new (identical re-adds are no-ops)."""
    gen = next_generation_for_increment(state.generation, generation)
    validate_batch(instances)
    owners = {
        (normalize_ip(ep.ip), ep.business_port): inst.id
        for inst in state.instances.values()
        for ep in inst.endpoints
    }
    merged = dict(state.instances)
    added: list[int] = []
    for inst in instances:
        existing = state.instances.get(inst.id)
        if existing is not None:
            if not existing.same_identity(inst):
                raise AlreadyExists(
                    f"instance {inst.id} already exists with another identity: "
                    f"{_describe_identity_diff(existing, inst)}; nothing applied",
                    reason="INSTANCE_ID_CONFLICT",
                    metadata={"instance_id": str(inst.id)},
                )
            continue  # identical re-add: keep the registered record (and its pause state)
        for ep in inst.endpoints:
            owner = owners.get((normalize_ip(ep.ip), ep.business_port))
            if owner is not None and owner != inst.id:
                raise AlreadyExists(
                    f"endpoint {ep.host_port} of instance {inst.id} is already served by "
                    f"instance {owner}; nothing applied",
                    reason="ENDPOINT_IN_USE",
                    metadata={"instance_id": str(inst.id), "owner_id": str(owner)},
                )
        merged[inst.id] = _registered(inst)
        added.append(inst.id)
    return _state(gen, merged, True, state.managed or generation > 0), added


def delete_instances(
    state: RegistryState, instances: Sequence[Instance], generation: int
) -> tuple[RegistryState, list[int]]:
    gen = next_generation_for_increment(state.generation, generation)
    seen: set[int] = set()
    for i, inst in enumerate(instances):
        if inst.id in seen:
            raise InvalidArgument(
                f"instance id {inst.id} appears twice; nothing deleted", reason="DUPLICATE_INSTANCE_ID"
            )
        seen.add(inst.id)
        registered = state.get(inst.id)
        if not registered.same_identity(inst):
            raise FailedPrecondition(
                f"instances[{i}]: instance {inst.id} does not match the registered instance "
                f"({_describe_identity_diff(registered, inst)}); nothing deleted",
                reason="IDENTITY_MISMATCH",
                metadata={"instance_id": str(inst.id)},
            )
    remaining = {k: v for k, v in state.instances.items() if k not in seen}
    return _state(gen, remaining, state.authoritative, state.managed or generation > 0), [i.id for i in instances]


def _set_status(
    state: RegistryState, ids: Iterable[int], generation: int, status: InstanceStatus
) -> RegistryState:
    if generation == 0 and state.managed:
        verb = "pause" if status is InstanceStatus.PAUSED else "resume"
        raise FailedPrecondition(
            f"this coordinator is managed by a controller, whose next push would undo a direct {verb}; "
            f"{verb} the instance through the controller instead (`motor {verb} ID`, or "
            f"ControllerAdminService/{verb.capitalize()}Instance). Pause/ResumeInstances without a generation are "
            f"for standalone coordinators",
            reason="MANAGED_BY_CONTROLLER",
            metadata={"current_generation": str(state.generation)},
        )
    gen = next_generation_for_increment(state.generation, generation)
    wanted = list(dict.fromkeys(ids))
    for iid in wanted:
        state.get(iid)
    merged = dict(state.instances)
    for iid in wanted:
        merged[iid] = replace(merged[iid], status=status)
    return _state(gen, merged, state.authoritative, state.managed or generation > 0)


def pause_instances(state: RegistryState, ids: Iterable[int], generation: int) -> RegistryState:
    return _set_status(state, ids, generation, InstanceStatus.PAUSED)


def resume_instances(state: RegistryState, ids: Iterable[int], generation: int) -> RegistryState:
    return _set_status(state, ids, generation, InstanceStatus.AVAILABLE)


# -- queries ------------------------------------------------------------------------------


def list_page(
    instances: Sequence[Instance], role: Role | None, page_size: int, page_token: str
) -> tuple[list[Instance], str]:
    """One page of *instances* (any order in), sorted by id; the token is the last id returned."""
    size = DEFAULT_PAGE_SIZE if page_size == 0 else min(page_size, MAX_PAGE_SIZE)
    after = -1
    if page_token:
        try:
            after = int(page_token)
        except ValueError:
            raise InvalidArgument(f"invalid page_token {page_token!r}", reason="INVALID_PAGE_TOKEN") from None
    rows = sorted((i for i in instances if (role is None or i.role is role) and i.id > after), key=lambda i: i.id)
    page = rows[:size]
    token = str(page[-1].id) if len(rows) > size else ""
    return page, token
