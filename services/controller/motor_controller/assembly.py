"""Instance assembly (pure): the nodes of one job become one instance.

- The instance id is derived from the job name and the job's incarnation (bumped each time an
  instance of the job is retired), hashed into 52 bits: below 2^52, never with bit 52 (the
  standalone CLI's namespace), so every id is exact as a JSON/JavaScript number (<= 2^53 - 1). A
  retried apply computes the same id, so it is a no-op.
- Endpoints carry **global** DP ranks: ``node_rank * endpoints_per_node + local_rank``; the
  endpoint id equals the global rank (engines and the DP scale-down protocol rely on it).
- The DP master is the rank-0 node's ip plus the configured DP RPC port.
- Every node must agree on role, engine, model, nodes_per_instance, endpoints per node and
  fault-tolerance capabilities; any disagreement **fails closed** with a reason.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from motor_common.domain import (
    INSTANCE_HASH_MASK,
    STANDALONE_ID_BIT,
    Endpoint,
    EngineType,
    Instance,
    NodeSpec,
    Role,
)
from motor_common.ports import host_port

ID_MASK = INSTANCE_HASH_MASK  # 52 bits


def instance_id_for(job_name: str, incarnation: int) -> int:
    """Deterministic controller instance id (1 <= id < 2^52)."""
    digest = hashlib.sha256(f"motor-instance\x00{job_name}\x00{incarnation}".encode()).digest()
    value = int.from_bytes(digest[:8], "big") & ID_MASK
    assert not value & STANDALONE_ID_BIT
    return value or 1


@dataclass(frozen=True)
class Assembly:
    """Result of assembling one job: an instance, or a fail-closed reason (``instance`` None)."""

    instance_id: int
    job_name: str
    incarnation: int
    instance: Instance | None
    node_ids: tuple[str, ...]
    master_address: str
    reason: str = ""


@dataclass(frozen=True)
class StartCommand:
    """What one nodemanager is told to launch (mirrors StartEnginesRequest)."""

    node_id: str
    admin_address: str
    instance_id: int
    job_name: str
    role: Role
    engine_type: EngineType
    model_name: str
    endpoints: tuple[Endpoint, ...]
    node_rank: int
    num_nodes: int
    master_address: str
    master_port: int
    dp_size: int
    generation: int
    peers: tuple[Endpoint, ...]


def assemble(
    job_name: str, nodes: Sequence[NodeSpec], incarnation: int, master_port: int
) -> Assembly | None:
    """Assemble *nodes* of *job_name*; None while ranks are missing (keep waiting)."""
    if not nodes:
        return None
    iid = instance_id_for(job_name, incarnation)
    by_rank = sorted(nodes, key=lambda n: (n.node_rank, n.node_id))
    rank0 = by_rank[0]
    node_ids = tuple(n.node_id for n in by_rank)

    def fail(reason: str) -> Assembly:
        return Assembly(iid, job_name, incarnation, None, node_ids, "", f"assembly failed: {reason}")

    sizes = {n.nodes_per_instance for n in nodes}
    if len(sizes) != 1:
        return fail(f"nodes disagree on nodes_per_instance {sorted(sizes)}")
    size = sizes.pop()
    ranks = [n.node_rank for n in by_rank]
    if len(set(ranks)) != len(ranks):
        return fail(f"duplicate node ranks {ranks}")
    if set(ranks) != set(range(size)):
        if len(ranks) > size or max(ranks) >= size:
            return fail(f"node ranks {ranks} do not fit nodes_per_instance {size}")
        return None
    for attr in ("role", "engine_type", "model_name"):
        values = {getattr(n, attr) for n in nodes}
        if len(values) != 1:
            shown = sorted(v.value if hasattr(v, "value") else str(v) for v in values)
            return fail(f"nodes disagree on {attr}: {shown}")
    caps = {n.capabilities for n in nodes}
    if len(caps) != 1:
        detail = ", ".join(
            f"{n.node_id}=(ft={n.capabilities.fault_tolerance}, relaunch={n.capabilities.engine_relaunch}, "
            f"scale_down={n.capabilities.dp_scale_down})"
            for n in by_rank
        )
        return fail(f"fault-tolerance capabilities differ between nodes: {detail}")
    per_node = {len(n.endpoints) for n in nodes}
    if len(per_node) != 1:
        return fail(f"nodes disagree on endpoints per node {sorted(per_node)}")
    epn = per_node.pop()
    endpoints: list[Endpoint] = []
    for node in by_rank:
        for ep in sorted(node.endpoints, key=lambda e: e.dp_rank):
            rank = node.node_rank * epn + ep.dp_rank
            endpoints.append(
                Endpoint(
                    id=rank,
                    ip=node.ip,
                    business_port=ep.business_port,
                    bootstrap_port=ep.bootstrap_port,
                    kv_port=ep.kv_port,
                    dp_rank=rank,
                    kv_events_port=ep.kv_events_port,
                    kv_events_replay_port=ep.kv_events_replay_port,
                    node_id=node.node_id,
                )
            )
    instance = Instance(
        id=iid,
        role=rank0.role,
        job_name=job_name,
        model_name=rank0.model_name,
        engine_type=rank0.engine_type,
        endpoints=tuple(endpoints),
    )
    return Assembly(iid, job_name, incarnation, instance, node_ids, host_port(rank0.ip, master_port))


def start_commands(
    instance: Instance,
    nodes: Sequence[NodeSpec],
    master_address: str,
    master_port: int,
    generation: int,
) -> dict[str, StartCommand]:
    """One start command per node of an assembled instance."""
    peers = instance.endpoints if instance.role is Role.DECODE else ()
    master_ip = master_address.rsplit(":", 1)[0].strip("[]")
    out: dict[str, StartCommand] = {}
    for node in nodes:
        out[node.node_id] = StartCommand(
            node_id=node.node_id,
            admin_address=node.admin_address,
            instance_id=instance.id,
            job_name=instance.job_name,
            role=instance.role,
            engine_type=instance.engine_type,
            model_name=instance.model_name,
            endpoints=tuple(e for e in instance.endpoints if e.node_id == node.node_id),
            node_rank=node.node_rank,
            num_nodes=node.nodes_per_instance,
            master_address=master_ip,
            master_port=master_port,
            dp_size=len(instance.endpoints),
            generation=generation,
            peers=peers,
        )
    return out
