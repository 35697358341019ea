"""Builders for controller unit tests."""

from __future__ import annotations

from motor_common.domain import (
    Capabilities,
    Endpoint,
    EndpointHealth,
    EndpointStatus,
    EngineType,
    NodeSpec,
    Role,
)
from motor_controller.model import NodeObservation, NodeRecord, NodeState


def spec(
    rank: int = 0,
    n: int = 1,
    job: str = "job-p",
    eps: int = 2,
    role: Role = Role.PREFILL,
    caps: Capabilities | None = None,
    ip: str | None = None,
    node_id: str | None = None,
    base_port: int = 8000,
) -> NodeSpec:
    ip = ip or f"10.0.0.{rank + 1}"
    nid = node_id or f"{job}-n{rank}"
    return NodeSpec(
        node_id=nid,
        job_name=job,
        role=role,
        ip=ip,
        admin_port=7000 + rank,
        engine_type=EngineType.VLLM,
        model_name="m",
        node_rank=rank,
        nodes_per_instance=n,
        endpoints=tuple(
            Endpoint(id=i, ip=ip, business_port=base_port + i, dp_rank=i, node_id=nid) for i in range(eps)
        ),
        capabilities=caps or Capabilities(),
    )


def record(s: NodeSpec, registered_mono: float | None = 0.0) -> NodeRecord:
    return NodeRecord(spec=s, registered_at=1.0, registered_mono=registered_mono)


def obs(
    seen_at: float,
    instance_id: int,
    statuses: list[EndpointStatus],
    state: NodeState = NodeState.RUNNING,
    first_id: int = 0,
) -> NodeObservation:
    return NodeObservation(
        seen_at=seen_at,
        state=state,
        instance_id=instance_id,
        endpoints=tuple(EndpointHealth(first_id + i, s) for i, s in enumerate(statuses)),
    )
