"""The controller's own domain types (frozen dataclasses, no gRPC).

Desired state (persisted): :class:`NodeSpec` per node, :class:`ManagedInstance` per instance.
Observed state (memory only, rebuilt from heartbeats): :class:`NodeObservation`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from motor_common.domain import (
    EndpointHealth,
    Instance,
    NodeSpec,
)


class NodeState(enum.Enum):
    REGISTERED = "registered"
    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    RELAUNCHING = "relaunching"
    STOPPING = "stopping"
    RESTORED = "restored"


class InstanceState(enum.Enum):
    INITIAL = "initial"
    STARTING = "starting"
    ACTIVE = "active"
    INACTIVE = "inactive"
    RECOVERING = "recovering"
    DELETED = "deleted"


@dataclass(frozen=True)
class NodeObservation:
    """The last heartbeat of a node (observed state; never persisted)."""

    seen_at: float  # monotonic
    state: NodeState
    instance_id: int
    endpoints: tuple[EndpointHealth, ...]
    sequence: int = 0
    relaunch_count: int = 0
    wall_time: float = 0.0


@dataclass(frozen=True)
class NodeRecord:
    spec: NodeSpec
    registered_at: float  # wall clock, for display
    # Monotonic time of registration in this process; None for nodes loaded from the store.
    registered_mono: float | None = None


@dataclass(frozen=True)
class ManagedInstance:
    """A controller instance (desired state, persisted)."""

    id: int
    job_name: str
    incarnation: int
    state: InstanceState
    # None while assembly fails closed (see ``reason``).
    instance: Instance | None
    node_ids: tuple[str, ...]
    master_address: str
    state_changed_at: float  # wall clock
    reason: str = ""
    generation: int = 1
    # DP ranks coordinators must not see (a DP scale-down withdrew or retired them).
    withdrawn_dp_ranks: tuple[int, ...] = ()
    # Operator pause (PauseInstance, operator_pause.py): coordinators see the instance PAUSED.
    paused: bool = False
    pause_reason: str = ""
    paused_at: float = 0.0  # wall clock
    # Static stability (``node_lost_routing_grace_sec``): an instance that went INACTIVE because a
    # node of it was lost stays in the coordinators' routing until then (wall clock; 0 = not kept).
    # Set on the ACTIVE --NODE_LOST--> INACTIVE transition, cleared by any other transition or signal.
    routable_until: float = 0.0

    @property
    def blocked(self) -> bool:
        return self.instance is None

    @property
    def live(self) -> bool:
        return self.state is not InstanceState.DELETED


@dataclass(frozen=True)
class FaultReport:
    node_id: str
    instance_id: int
    endpoint_id: int
    level: str
    source: str
    pid: int
    detail: str
    received_at: float


@dataclass(frozen=True)
class NodeStatus:
    """A nodemanager's answer to GetStatus (polled by fault strategies)."""

    node_id: str
    state: NodeState | None
    instance_id: int
    endpoints: tuple[EndpointHealth, ...]
    frozen: bool = False
    relaunch_count: int = 0
