"""Operator pause and resume of an instance (pure): PauseInstance / ResumeInstance decisions.

The pause is a field of the persisted :class:`~motor_controller.model.ManagedInstance`, so it
survives a controller restart or takeover; ``push_plan.desired_view`` shows a paused ACTIVE
instance to coordinators as PAUSED. It is independent of a nodemanager's own pause (PauseNode,
observed through heartbeats as endpoints PAUSED): either keeps the instance out of scheduling.

A call names the instance by id (bounded 1 .. 2^53-1 by the chassis, ``motor_common.request_limits``)
or by one of its nodes (:func:`target`).
Errors: :class:`InvalidArgument` for a bad reason, :class:`FailedPrecondition` for a
deleted instance. ``None`` means "already so": the call is idempotent and writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from motor_common.errors import FailedPrecondition, InvalidArgument, NotFound
from motor_controller.model import ManagedInstance

MAX_REASON_BYTES = 256


def check_reason(reason: str) -> str:
    if len(reason.encode()) > MAX_REASON_BYTES:
        raise InvalidArgument(f"reason is {len(reason.encode())} bytes; at most {MAX_REASON_BYTES}",
                              reason="INVALID_REASON")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in reason):
        raise InvalidArgument("reason must be one line of printable text", reason="INVALID_REASON")
    return reason


def target(instance_id: int, node_id: str, instances: Iterable[ManagedInstance]) -> int:
    """The instance a Pause/ResumeInstance call names: *instance_id*, or the live instance *node_id*
    serves (exactly one of the two must be given)."""
    if bool(instance_id) == bool(node_id):
        raise InvalidArgument("give exactly one of instance_id and node_id", reason="INVALID_TARGET")
    if instance_id:
        return instance_id
    for mi in instances:
        if mi.live and node_id in mi.node_ids:
            return mi.id
    raise NotFound(f"node {node_id!r} serves no live instance (see ListNodes / `motor status`)",
                   reason="NODE_NOT_FOUND", metadata={"node_id": node_id})


def _live(mi: ManagedInstance, verb: str) -> None:
    if not mi.live:
        raise FailedPrecondition(f"instance {mi.id} is deleted ({mi.reason}); there is nothing to {verb}",
                                 reason="INSTANCE_DELETED")


def pause(mi: ManagedInstance, reason: str, wall: float) -> ManagedInstance | None:
    """*mi* paused with *reason*; ``None`` when it is already paused (the first reason stays)."""
    _live(mi, "pause")
    if mi.paused:
        return None
    return replace(mi, paused=True, pause_reason=reason or "paused by an operator", paused_at=wall)


def resume(mi: ManagedInstance) -> ManagedInstance | None:
    """*mi* without its operator pause; ``None`` when it is not paused."""
    _live(mi, "resume")
    if not mi.paused:
        return None
    return replace(mi, paused=False, pause_reason="", paused_at=0.0)
