"""Controller protos ↔ controller domain types (used only at the gRPC boundary)."""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from motor_common.convert import (
    ENGINE_TO_PB,
    ROLE_TO_PB,
    endpoint_health_from_pb,
    endpoint_health_to_pb,
    endpoint_to_pb,
    instance_to_pb,
    node_spec_to_pb,
)
from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as npb
from motor_controller.alarms import Alarm, AlarmAction, AlarmKind
from motor_controller.assembly import StartCommand
from motor_controller.model import (
    InstanceState,
    ManagedInstance,
    NodeObservation,
    NodeRecord,
    NodeState,
    NodeStatus,
)

NODE_STATE_FROM_PB = {
    pb.NODE_STATE_REGISTERED: NodeState.REGISTERED,
    pb.NODE_STATE_STARTING: NodeState.STARTING,
    pb.NODE_STATE_RUNNING: NodeState.RUNNING,
    pb.NODE_STATE_PAUSED: NodeState.PAUSED,
    pb.NODE_STATE_RELAUNCHING: NodeState.RELAUNCHING,
    pb.NODE_STATE_STOPPING: NodeState.STOPPING,
    pb.NODE_STATE_RESTORED: NodeState.RESTORED,
}
NODE_STATE_TO_PB = {v: k for k, v in NODE_STATE_FROM_PB.items()}
INSTANCE_STATE_TO_PB = {
    InstanceState.INITIAL: pb.INSTANCE_STATE_INITIAL,
    InstanceState.STARTING: pb.INSTANCE_STATE_STARTING,
    InstanceState.ACTIVE: pb.INSTANCE_STATE_ACTIVE,
    InstanceState.INACTIVE: pb.INSTANCE_STATE_INACTIVE,
    InstanceState.RECOVERING: pb.INSTANCE_STATE_RECOVERING,
    InstanceState.DELETED: pb.INSTANCE_STATE_DELETED,
}
ALARM_KIND_FROM_PB = {
    pb.ALARM_KIND_PRECISION: AlarmKind.PRECISION,
    pb.ALARM_KIND_COORDINATOR_PROMOTED: AlarmKind.COORDINATOR_PROMOTED,
    pb.ALARM_KIND_STORE_UNAVAILABLE: AlarmKind.STORE_UNAVAILABLE,
    pb.ALARM_KIND_STATE_LOAD_FAILED: AlarmKind.STATE_LOAD_FAILED,
}
ALARM_KIND_TO_PB = {v: k for k, v in ALARM_KIND_FROM_PB.items()}
ALARM_ACTION_FROM_PB = {pb.ALARM_ACTION_RAISE: AlarmAction.RAISE, pb.ALARM_ACTION_CLEAR: AlarmAction.CLEAR}
ALARM_ACTION_TO_PB = {v: k for k, v in ALARM_ACTION_FROM_PB.items()}


def ts(wall: float) -> timestamp_pb2.Timestamp:
    out = timestamp_pb2.Timestamp()
    if wall:
        out.FromNanoseconds(int(wall * 1e9))
    return out


def node_status_from_pb(msg: npb.GetStatusResponse) -> NodeStatus:
    return NodeStatus(
        node_id=msg.node_id,
        state=NODE_STATE_FROM_PB.get(msg.state),
        instance_id=msg.instance_id,
        endpoints=tuple(endpoint_health_from_pb(e) for e in msg.endpoints),
        frozen=msg.frozen,
        relaunch_count=msg.relaunch_count,
    )


def observation_from_pb(msg: pb.HeartbeatRequest, now: float, wall: float) -> NodeObservation:
    return NodeObservation(
        seen_at=now,
        state=NODE_STATE_FROM_PB.get(msg.state, NodeState.REGISTERED),
        instance_id=msg.instance_id,
        endpoints=tuple(endpoint_health_from_pb(e) for e in msg.endpoints),
        sequence=msg.sequence,
        relaunch_count=msg.relaunch_count,
        wall_time=wall,
    )


def node_to_pb(rec: NodeRecord, ob: NodeObservation | None) -> pb.Node:
    out = pb.Node(spec=node_spec_to_pb(rec.spec), registered_at=ts(rec.registered_at))
    out.state = NODE_STATE_TO_PB[ob.state] if ob else pb.NODE_STATE_REGISTERED
    if ob is not None:
        out.instance_id = ob.instance_id
        out.last_heartbeat_at.CopyFrom(ts(ob.wall_time))
        out.endpoints.extend(endpoint_health_to_pb(h) for h in ob.endpoints)
    return out


def managed_to_pb(mi: ManagedInstance) -> pb.ManagedInstance:
    out = pb.ManagedInstance(
        state=INSTANCE_STATE_TO_PB[mi.state],
        node_ids=list(mi.node_ids),
        master_address=mi.master_address,
        state_changed_at=ts(mi.state_changed_at),
        reason=mi.reason,
        paused=mi.paused,
        pause_reason=mi.pause_reason,
    )
    if mi.paused:
        out.paused_at.CopyFrom(ts(mi.paused_at))
    if mi.instance is not None:
        out.instance.CopyFrom(instance_to_pb(mi.instance))
    else:
        out.instance.CopyFrom(tpb.Instance(id=mi.id, job_name=mi.job_name))
    return out


# Every active alarm is persisted and reloaded (up to MAX_ACTIVE_ALARMS), so its size is bounded
# tighter than the generic request limits: its identity (source, instance ids) and address are
# refused beyond these; the message, free text, is cut (a coordinator's outbox retries a refused
# report for ever).
MAX_ALARM_SOURCE = 512  # "coordinator@" + a DNS name (253) + ":port"
MAX_ALARM_ADDRESS = 512
MAX_ALARM_MESSAGE = 1024
MAX_ALARM_INSTANCE_IDS = 2  # a P/D group: one prefill and one decode instance, or one union instance


def alarm_from_pb(msg: pb.Alarm, wall: float) -> Alarm:
    from motor_common.errors import InvalidArgument

    if msg.kind not in ALARM_KIND_FROM_PB:
        raise InvalidArgument("alarm.kind is required", reason="INVALID_ALARM")
    if msg.action not in ALARM_ACTION_FROM_PB:
        raise InvalidArgument("alarm.action must be RAISE or CLEAR", reason="INVALID_ALARM")
    if not msg.source:
        raise InvalidArgument("alarm.source is required", reason="INVALID_ALARM")
    for field, value, limit in (("source", msg.source, MAX_ALARM_SOURCE), ("address", msg.address, MAX_ALARM_ADDRESS)):
        if len(value) > limit:
            raise InvalidArgument(f"alarm.{field} is {len(value)} characters long; at most {limit} are allowed",
                                  reason="INVALID_ALARM", metadata={"field": f"alarm.{field}"})
    if len(msg.instance_ids) > MAX_ALARM_INSTANCE_IDS:
        raise InvalidArgument(f"alarm.instance_ids has {len(msg.instance_ids)} ids; an alarm concerns one P/D group "
                              f"(at most {MAX_ALARM_INSTANCE_IDS})", reason="INVALID_ALARM",
                              metadata={"field": "alarm.instance_ids"})
    kind = ALARM_KIND_FROM_PB[msg.kind]
    if kind is AlarmKind.STATE_LOAD_FAILED:
        raise InvalidArgument("STATE_LOAD_FAILED is raised by a controller about itself; it cannot be reported",
                              reason="INVALID_ALARM", metadata={"field": "alarm.kind"})
    if kind is AlarmKind.PRECISION and not msg.instance_ids:
        raise InvalidArgument("a precision alarm needs the instance ids of its P/D group", reason="INVALID_ALARM")
    raised = msg.raised_at.ToNanoseconds() / 1e9 if msg.HasField("raised_at") else wall
    message = msg.message if len(msg.message) <= MAX_ALARM_MESSAGE else msg.message[: MAX_ALARM_MESSAGE - 1] + "…"
    return Alarm(
        kind=kind,
        action=ALARM_ACTION_FROM_PB[msg.action],
        source=msg.source,
        instance_ids=tuple(msg.instance_ids),
        address=msg.address,
        message=message,
        raised_at=raised,
    )


def alarm_to_pb(a: Alarm) -> pb.Alarm:
    return pb.Alarm(
        kind=ALARM_KIND_TO_PB[a.kind],
        action=ALARM_ACTION_TO_PB[a.action],
        source=a.source,
        instance_ids=list(a.instance_ids),
        address=a.address,
        message=a.message,
        raised_at=ts(a.raised_at),
    )


def start_request(cmd: StartCommand, request_id: str = "") -> npb.StartEnginesRequest:
    return npb.StartEnginesRequest(
        instance_id=cmd.instance_id,
        job_name=cmd.job_name,
        role=ROLE_TO_PB[cmd.role],
        engine_type=ENGINE_TO_PB[cmd.engine_type],
        model_name=cmd.model_name,
        endpoints=[endpoint_to_pb(e) for e in cmd.endpoints],
        node_rank=cmd.node_rank,
        num_nodes=cmd.num_nodes,
        master_address=cmd.master_address,
        master_port=cmd.master_port,
        dp_size=cmd.dp_size,
        generation=cmd.generation,
        peers=[endpoint_to_pb(e) for e in cmd.peers],
        request_id=request_id,
    )
