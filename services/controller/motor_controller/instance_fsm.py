"""Instance lifecycle: the only place where instance state transitions are defined (pure).

::

    INITIAL --START_DISPATCHED--> STARTING --HEALTHY/PAUSED--> ACTIVE <--HEALTHY/PAUSED-- INACTIVE
       |                             |                           |  NODE_LOST/ABNORMAL/PENDING ^
       |                             +--NODE_LOST-----------------------------------------------+
    any live state --RECOVERY_BEGIN--> RECOVERING --RECOVERY_DONE/FAILED--> INACTIVE
    any live state --TERMINATE--> DELETED (terminal)

Observation signals are computed level-triggered by :func:`observe` from the whole observed state
(registry + last heartbeats + clock). ACTIVE needs every node *fresh* (last heartbeat younger than
the timeout) and every endpoint NORMAL, so a partly lost instance never flaps back to ACTIVE:
hysteresis comes from freshness, not timers. UNKNOWN (a node loaded from the store has not
heartbeated yet and the controller is still within its re-attach grace, ``reattach_until``: a
restarted or newly elected controller waits for the fleet's heartbeat streams to come back) never
moves anything.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from motor_common.domain import EndpointStatus
from motor_controller.model import (
    InstanceState,
    ManagedInstance,
    NodeObservation,
    NodeRecord,
    NodeState,
)


class Signal(enum.Enum):
    HEALTHY = "healthy"
    PAUSED = "paused"
    PENDING = "pending"
    UNKNOWN = "unknown"
    NODE_LOST = "node_lost"
    ABNORMAL = "abnormal"
    START_DISPATCHED = "start_dispatched"
    RECOVERY_BEGIN = "recovery_begin"
    RECOVERY_DONE = "recovery_done"
    RECOVERY_FAILED = "recovery_failed"
    TERMINATE = "terminate"


S = InstanceState
_LIVE = (S.INITIAL, S.STARTING, S.ACTIVE, S.INACTIVE, S.RECOVERING)

TRANSITIONS: dict[tuple[InstanceState, Signal], InstanceState] = {
    (S.INITIAL, Signal.START_DISPATCHED): S.STARTING,
    (S.INITIAL, Signal.HEALTHY): S.ACTIVE,
    (S.INITIAL, Signal.PAUSED): S.ACTIVE,
    (S.STARTING, Signal.HEALTHY): S.ACTIVE,
    (S.STARTING, Signal.PAUSED): S.ACTIVE,
    (S.STARTING, Signal.NODE_LOST): S.INACTIVE,
    (S.ACTIVE, Signal.NODE_LOST): S.INACTIVE,
    (S.ACTIVE, Signal.ABNORMAL): S.INACTIVE,
    (S.ACTIVE, Signal.PENDING): S.INACTIVE,
    (S.INACTIVE, Signal.HEALTHY): S.ACTIVE,
    (S.INACTIVE, Signal.PAUSED): S.ACTIVE,
    (S.RECOVERING, Signal.RECOVERY_DONE): S.INACTIVE,
    (S.RECOVERING, Signal.RECOVERY_FAILED): S.INACTIVE,
    **{(state, Signal.RECOVERY_BEGIN): S.RECOVERING for state in _LIVE if state is not S.RECOVERING},
    **{(state, Signal.TERMINATE): S.DELETED for state in _LIVE},
}


def transition(state: InstanceState, signal: Signal) -> InstanceState | None:
    """The next state, or None when *signal* does not move *state*."""
    nxt = TRANSITIONS.get((state, signal))
    return None if nxt is None or nxt is state else nxt


_PRIORITY = [Signal.NODE_LOST, Signal.ABNORMAL, Signal.UNKNOWN, Signal.PENDING, Signal.PAUSED, Signal.HEALTHY]


def observe(
    inst: ManagedInstance,
    nodes: Mapping[str, NodeRecord],
    observations: Mapping[str, NodeObservation],
    now: float,
    timeout: float,
    reattach_until: float,
) -> tuple[Signal, str]:
    """Summarise the observed state of *inst*'s nodes into one signal and a reason."""
    if inst.instance is None:
        return Signal.PENDING, inst.reason
    found: dict[Signal, str] = {}
    for node_id in inst.node_ids:
        sig, why = observe_node(inst, node_id, nodes.get(node_id), observations.get(node_id), now, timeout,
                                 reattach_until)
        found.setdefault(sig, f"node {node_id}: {why}")
    for sig in _PRIORITY:
        if sig in found:
            return sig, found[sig]
    return Signal.PENDING, "no nodes"  # pragma: no cover - instances always have nodes


def observe_node(
    inst: ManagedInstance,
    node_id: str,
    rec: NodeRecord | None,
    ob: NodeObservation | None,
    now: float,
    timeout: float,
    reattach_until: float,
) -> tuple[Signal, str]:
    """One node's part of :func:`observe`: its signal for *inst* and why."""
    if rec is None:
        return Signal.NODE_LOST, "not registered"
    if ob is None:
        if rec.registered_mono is not None:
            if now - rec.registered_mono < timeout:
                return Signal.PENDING, "registered, waiting for its first heartbeat"
            return Signal.NODE_LOST, "no heartbeat since registration"
        if now < reattach_until:
            return Signal.UNKNOWN, "no heartbeat since the controller started (waiting for the fleet to re-attach)"
        return Signal.NODE_LOST, "no heartbeat since the controller started"
    age = now - ob.seen_at
    if age >= timeout:
        return Signal.NODE_LOST, f"last heartbeat {age:.1f}s ago (timeout {timeout:g}s)"
    if ob.state is NodeState.STOPPING:
        return Signal.ABNORMAL, "stopping"
    if ob.instance_id != inst.id or ob.state in (NodeState.REGISTERED, NodeState.RESTORED):
        return Signal.PENDING, f"not running this instance (state {ob.state.value}, instance {ob.instance_id})"
    assert inst.instance is not None
    withdrawn = {e.id for e in inst.instance.endpoints if e.node_id == node_id and e.dp_rank in inst.withdrawn_dp_ranks}
    expected = sum(1 for e in inst.instance.endpoints if e.node_id == node_id) - len(withdrawn)
    statuses = [h.status for h in ob.endpoints if h.status is not EndpointStatus.RETIRED and h.endpoint_id not in withdrawn]
    if EndpointStatus.ABNORMAL in statuses:
        bad = [h.endpoint_id for h in ob.endpoints if h.status is EndpointStatus.ABNORMAL]
        return Signal.ABNORMAL, f"endpoints {bad} ABNORMAL"
    if len(statuses) != expected:
        return Signal.PENDING, f"reports {len(statuses)} endpoints, expected {expected}"
    if any(s not in (EndpointStatus.NORMAL, EndpointStatus.PAUSED) for s in statuses):
        return Signal.PENDING, "endpoints starting"
    if ob.state is NodeState.PAUSED or EndpointStatus.PAUSED in statuses:
        return Signal.PAUSED, "paused"
    return Signal.HEALTHY, "all endpoints NORMAL"
