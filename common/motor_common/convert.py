"""Conversions between the wire types (motor.common.v1) and the domain dataclasses."""

from __future__ import annotations

from motor_common.domain import (
    Capabilities,
    Endpoint,
    EndpointHealth,
    EndpointStatus,
    EngineType,
    Instance,
    InstanceStatus,
    NodeSpec,
    Role,
)
from motor_common.errors import InvalidArgument
from motor_common.gen.motor.common.v1 import types_pb2 as pb
from motor_common.gen.motor.controller.v1 import controller_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as copb
from motor_common.model_card import ModelCard, Permission

ROLE_TO_PB = {Role.PREFILL: pb.ROLE_PREFILL, Role.DECODE: pb.ROLE_DECODE, Role.UNION: pb.ROLE_UNION}
ROLE_FROM_PB = {v: k for k, v in ROLE_TO_PB.items()}
ENGINE_TO_PB = {EngineType.VLLM: pb.ENGINE_TYPE_VLLM, EngineType.SGLANG: pb.ENGINE_TYPE_SGLANG}
ENGINE_FROM_PB = {v: k for k, v in ENGINE_TO_PB.items()}
STATUS_TO_PB = {
    InstanceStatus.AVAILABLE: pb.INSTANCE_STATUS_AVAILABLE,
    InstanceStatus.UNAVAILABLE: pb.INSTANCE_STATUS_UNAVAILABLE,
    InstanceStatus.PAUSED: pb.INSTANCE_STATUS_PAUSED,
}


def role_from_pb(value: int, where: str = "role") -> Role:
    try:
        return ROLE_FROM_PB[value]  # type: ignore[index]
    except KeyError:
        raise InvalidArgument(f"{where}: must be ROLE_PREFILL, ROLE_DECODE or ROLE_UNION", reason="INVALID_ROLE") from None


def engine_from_pb(value: int, where: str = "engine_type") -> EngineType:
    try:
        return ENGINE_FROM_PB[value]  # type: ignore[index]
    except KeyError:
        raise InvalidArgument(f"{where}: must be ENGINE_TYPE_VLLM or ENGINE_TYPE_SGLANG", reason="INVALID_ENGINE_TYPE") from None


def endpoint_from_pb(msg: pb.Endpoint) -> Endpoint:
    return Endpoint(
        id=msg.id,
        ip=msg.ip,
        business_port=msg.business_port,
        bootstrap_port=msg.bootstrap_port,
        kv_port=msg.kv_port,
        dp_rank=msg.dp_rank,
        node_id=msg.node_id,
        kv_events_port=msg.kv_events_port,
        kv_events_replay_port=msg.kv_events_replay_port,
    )


def endpoint_to_pb(ep: Endpoint) -> pb.Endpoint:
    return pb.Endpoint(
        id=ep.id,
        ip=ep.ip,
        business_port=ep.business_port,
        bootstrap_port=ep.bootstrap_port,
        kv_port=ep.kv_port,
        dp_rank=ep.dp_rank,
        node_id=ep.node_id,
        kv_events_port=ep.kv_events_port,
        kv_events_replay_port=ep.kv_events_replay_port,
    )


STATUS_FROM_PB = {v: k for k, v in STATUS_TO_PB.items()}


def instance_from_pb(msg: pb.Instance, where: str = "instance", *, keep_status: bool = False) -> Instance:
    """Convert without semantic validation (the registry validates); enums must be set.

    Servers receiving Set/Add keep only PAUSED (anything else registers available, as the proto
    documents); clients reading List/Get pass ``keep_status=True`` to see the real status.
    """
    if keep_status:
        status = STATUS_FROM_PB.get(msg.status, InstanceStatus.AVAILABLE)
    else:
        status = InstanceStatus.PAUSED if msg.status == pb.INSTANCE_STATUS_PAUSED else InstanceStatus.AVAILABLE
    return Instance(
        id=msg.id,
        role=role_from_pb(msg.role, f"{where}.role"),
        job_name=msg.job_name,
        model_name=msg.model_name,
        engine_type=engine_from_pb(msg.engine_type, f"{where}.engine_type"),
        endpoints=tuple(endpoint_from_pb(e) for e in msg.endpoints),
        status=status,
    )


def instance_to_pb(inst: Instance) -> pb.Instance:
    return pb.Instance(
        id=inst.id,
        role=ROLE_TO_PB[inst.role],
        job_name=inst.job_name,
        model_name=inst.model_name,
        engine_type=ENGINE_TO_PB[inst.engine_type],
        endpoints=[endpoint_to_pb(e) for e in inst.endpoints],
        status=STATUS_TO_PB[inst.status],
    )


EP_STATUS_FROM_PB = {
    pb.ENDPOINT_STATUS_INITIAL: EndpointStatus.INITIAL,
    pb.ENDPOINT_STATUS_NORMAL: EndpointStatus.NORMAL,
    pb.ENDPOINT_STATUS_ABNORMAL: EndpointStatus.ABNORMAL,
    pb.ENDPOINT_STATUS_PAUSED: EndpointStatus.PAUSED,
    pb.ENDPOINT_STATUS_RETIRED: EndpointStatus.RETIRED,
}
EP_STATUS_TO_PB = {v: k for k, v in EP_STATUS_FROM_PB.items()}


def endpoint_health_from_pb(msg: cpb.EndpointHealth) -> EndpointHealth:
    return EndpointHealth(
        endpoint_id=msg.endpoint_id,
        status=EP_STATUS_FROM_PB.get(msg.status, EndpointStatus.INITIAL),
        generation=msg.generation,
        pid=msg.pid,
        was_normal=msg.was_normal,
        detail=msg.detail,
    )


def endpoint_health_to_pb(h: EndpointHealth) -> cpb.EndpointHealth:
    return cpb.EndpointHealth(
        endpoint_id=h.endpoint_id,
        status=EP_STATUS_TO_PB[h.status],
        generation=h.generation,
        pid=h.pid,
        was_normal=h.was_normal,
        detail=h.detail,
    )


def node_spec_from_pb(msg: cpb.NodeSpec) -> NodeSpec:
    """Enum and shape conversion only; the controller's registry validates semantics."""
    return NodeSpec(
        node_id=msg.node_id,
        job_name=msg.job_name,
        role=role_from_pb(msg.role, "node.role"),
        ip=msg.ip,
        admin_port=msg.admin_port,
        engine_type=engine_from_pb(msg.engine_type, "node.engine_type"),
        model_name=msg.model_name,
        node_rank=msg.node_rank,
        nodes_per_instance=msg.nodes_per_instance,
        endpoints=tuple(endpoint_from_pb(e) for e in msg.endpoints),
        capabilities=Capabilities(
            fault_tolerance=msg.capabilities.fault_tolerance,
            engine_relaunch=msg.capabilities.engine_relaunch,
            dp_scale_down=msg.capabilities.dp_scale_down,
        ),
        local_world_size=msg.local_world_size,
    )


def node_spec_to_pb(spec: NodeSpec) -> cpb.NodeSpec:
    return cpb.NodeSpec(
        node_id=spec.node_id,
        job_name=spec.job_name,
        role=ROLE_TO_PB[spec.role],
        ip=spec.ip,
        admin_port=spec.admin_port,
        engine_type=ENGINE_TO_PB[spec.engine_type],
        model_name=spec.model_name,
        node_rank=spec.node_rank,
        nodes_per_instance=spec.nodes_per_instance,
        endpoints=[endpoint_to_pb(e) for e in spec.endpoints],
        capabilities=cpb.Capabilities(
            fault_tolerance=spec.capabilities.fault_tolerance,
            engine_relaunch=spec.capabilities.engine_relaunch,
            dp_scale_down=spec.capabilities.dp_scale_down,
        ),
        local_world_size=spec.local_world_size,
    )


# -- model cards (coordinator ListModels) --------------------------------------------------------

_PERMISSION_FLAGS = ("allow_create_engine", "allow_sampling", "allow_logprobs", "allow_search_indices",
                     "allow_view", "allow_fine_tuning", "is_blocking")


def model_card_to_pb(card: ModelCard, out: copb.Model) -> None:
    """Fill *out*'s engine-card fields (6-9) from *card*."""
    out.max_model_len = card.max_model_len
    out.root = card.root
    if card.parent is not None:
        out.parent = card.parent
    for p in card.permission:
        perm = out.permission.add(id=p.id, created=p.created, organization=p.organization,
                                  **{f: getattr(p, f) for f in _PERMISSION_FLAGS})
        if p.group is not None:
            perm.group = p.group


def model_card_from_pb(msg: copb.Model) -> ModelCard | None:
    """The engine card a ListModels entry carries, or None when the coordinator has none yet."""
    if not msg.root and not msg.max_model_len:
        return None
    perms = tuple(Permission(id=p.id, created=p.created, organization=p.organization,
                             group=p.group if p.HasField("group") else None,
                             **{f: getattr(p, f) for f in _PERMISSION_FLAGS}) for p in msg.permission)
    return ModelCard(root=msg.root, max_model_len=msg.max_model_len,
                     parent=msg.parent if msg.HasField("parent") else None, permission=perms)
