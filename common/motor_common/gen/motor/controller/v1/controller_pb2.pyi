import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from motor_common.gen.motor.common.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATE_UNSPECIFIED: _ClassVar[NodeState]
    NODE_STATE_REGISTERED: _ClassVar[NodeState]
    NODE_STATE_STARTING: _ClassVar[NodeState]
    NODE_STATE_RUNNING: _ClassVar[NodeState]
    NODE_STATE_PAUSED: _ClassVar[NodeState]
    NODE_STATE_RELAUNCHING: _ClassVar[NodeState]
    NODE_STATE_STOPPING: _ClassVar[NodeState]
    NODE_STATE_RESTORED: _ClassVar[NodeState]

class HeartbeatCommand(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HEARTBEAT_COMMAND_UNSPECIFIED: _ClassVar[HeartbeatCommand]
    HEARTBEAT_COMMAND_NONE: _ClassVar[HeartbeatCommand]
    HEARTBEAT_COMMAND_REREGISTER: _ClassVar[HeartbeatCommand]

class FaultLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAULT_LEVEL_UNSPECIFIED: _ClassVar[FaultLevel]
    FAULT_LEVEL_ENGINE_UNHEALTHY: _ClassVar[FaultLevel]
    FAULT_LEVEL_ENGINE_DEAD: _ClassVar[FaultLevel]

class FaultSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAULT_SOURCE_UNSPECIFIED: _ClassVar[FaultSource]
    FAULT_SOURCE_PROCESS_EXIT: _ClassVar[FaultSource]
    FAULT_SOURCE_HEALTH_PROBE: _ClassVar[FaultSource]
    FAULT_SOURCE_ENGINE_PUBLISHER: _ClassVar[FaultSource]

class AlarmKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ALARM_KIND_UNSPECIFIED: _ClassVar[AlarmKind]
    ALARM_KIND_PRECISION: _ClassVar[AlarmKind]
    ALARM_KIND_COORDINATOR_PROMOTED: _ClassVar[AlarmKind]
    ALARM_KIND_STORE_UNAVAILABLE: _ClassVar[AlarmKind]
    ALARM_KIND_STATE_LOAD_FAILED: _ClassVar[AlarmKind]

class AlarmAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ALARM_ACTION_UNSPECIFIED: _ClassVar[AlarmAction]
    ALARM_ACTION_RAISE: _ClassVar[AlarmAction]
    ALARM_ACTION_CLEAR: _ClassVar[AlarmAction]

class InstanceState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INSTANCE_STATE_UNSPECIFIED: _ClassVar[InstanceState]
    INSTANCE_STATE_INITIAL: _ClassVar[InstanceState]
    INSTANCE_STATE_STARTING: _ClassVar[InstanceState]
    INSTANCE_STATE_ACTIVE: _ClassVar[InstanceState]
    INSTANCE_STATE_INACTIVE: _ClassVar[InstanceState]
    INSTANCE_STATE_RECOVERING: _ClassVar[InstanceState]
    INSTANCE_STATE_DELETED: _ClassVar[InstanceState]

class FaultToleranceState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAULT_TOLERANCE_STATE_UNSPECIFIED: _ClassVar[FaultToleranceState]
    FAULT_TOLERANCE_STATE_DISABLED: _ClassVar[FaultToleranceState]
    FAULT_TOLERANCE_STATE_IDLE: _ClassVar[FaultToleranceState]
    FAULT_TOLERANCE_STATE_RELAUNCHING: _ClassVar[FaultToleranceState]
    FAULT_TOLERANCE_STATE_RECONFIGURING: _ClassVar[FaultToleranceState]
    FAULT_TOLERANCE_STATE_FAILED: _ClassVar[FaultToleranceState]
    FAULT_TOLERANCE_STATE_AWAITING_RECOVERY: _ClassVar[FaultToleranceState]
    FAULT_TOLERANCE_STATE_RESTARTING_NODES: _ClassVar[FaultToleranceState]
NODE_STATE_UNSPECIFIED: NodeState
NODE_STATE_REGISTERED: NodeState
NODE_STATE_STARTING: NodeState
NODE_STATE_RUNNING: NodeState
NODE_STATE_PAUSED: NodeState
NODE_STATE_RELAUNCHING: NodeState
NODE_STATE_STOPPING: NodeState
NODE_STATE_RESTORED: NodeState
HEARTBEAT_COMMAND_UNSPECIFIED: HeartbeatCommand
HEARTBEAT_COMMAND_NONE: HeartbeatCommand
HEARTBEAT_COMMAND_REREGISTER: HeartbeatCommand
FAULT_LEVEL_UNSPECIFIED: FaultLevel
FAULT_LEVEL_ENGINE_UNHEALTHY: FaultLevel
FAULT_LEVEL_ENGINE_DEAD: FaultLevel
FAULT_SOURCE_UNSPECIFIED: FaultSource
FAULT_SOURCE_PROCESS_EXIT: FaultSource
FAULT_SOURCE_HEALTH_PROBE: FaultSource
FAULT_SOURCE_ENGINE_PUBLISHER: FaultSource
ALARM_KIND_UNSPECIFIED: AlarmKind
ALARM_KIND_PRECISION: AlarmKind
ALARM_KIND_COORDINATOR_PROMOTED: AlarmKind
ALARM_KIND_STORE_UNAVAILABLE: AlarmKind
ALARM_KIND_STATE_LOAD_FAILED: AlarmKind
ALARM_ACTION_UNSPECIFIED: AlarmAction
ALARM_ACTION_RAISE: AlarmAction
ALARM_ACTION_CLEAR: AlarmAction
INSTANCE_STATE_UNSPECIFIED: InstanceState
INSTANCE_STATE_INITIAL: InstanceState
INSTANCE_STATE_STARTING: InstanceState
INSTANCE_STATE_ACTIVE: InstanceState
INSTANCE_STATE_INACTIVE: InstanceState
INSTANCE_STATE_RECOVERING: InstanceState
INSTANCE_STATE_DELETED: InstanceState
FAULT_TOLERANCE_STATE_UNSPECIFIED: FaultToleranceState
FAULT_TOLERANCE_STATE_DISABLED: FaultToleranceState
FAULT_TOLERANCE_STATE_IDLE: FaultToleranceState
FAULT_TOLERANCE_STATE_RELAUNCHING: FaultToleranceState
FAULT_TOLERANCE_STATE_RECONFIGURING: FaultToleranceState
FAULT_TOLERANCE_STATE_FAILED: FaultToleranceState
FAULT_TOLERANCE_STATE_AWAITING_RECOVERY: FaultToleranceState
FAULT_TOLERANCE_STATE_RESTARTING_NODES: FaultToleranceState

class Capabilities(_message.Message):
    __slots__ = ("fault_tolerance", "engine_relaunch", "dp_scale_down")
    FAULT_TOLERANCE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_RELAUNCH_FIELD_NUMBER: _ClassVar[int]
    DP_SCALE_DOWN_FIELD_NUMBER: _ClassVar[int]
    fault_tolerance: bool
    engine_relaunch: bool
    dp_scale_down: bool
    def __init__(self, fault_tolerance: _Optional[bool] = ..., engine_relaunch: _Optional[bool] = ..., dp_scale_down: _Optional[bool] = ...) -> None: ...

class NodeSpec(_message.Message):
    __slots__ = ("node_id", "job_name", "role", "ip", "admin_port", "engine_type", "model_name", "node_rank", "nodes_per_instance", "endpoints", "capabilities", "local_world_size")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    IP_FIELD_NUMBER: _ClassVar[int]
    ADMIN_PORT_FIELD_NUMBER: _ClassVar[int]
    ENGINE_TYPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_RANK_FIELD_NUMBER: _ClassVar[int]
    NODES_PER_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    LOCAL_WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    job_name: str
    role: _types_pb2.Role
    ip: str
    admin_port: int
    engine_type: _types_pb2.EngineType
    model_name: str
    node_rank: int
    nodes_per_instance: int
    endpoints: _containers.RepeatedCompositeFieldContainer[_types_pb2.Endpoint]
    capabilities: Capabilities
    local_world_size: int
    def __init__(self, node_id: _Optional[str] = ..., job_name: _Optional[str] = ..., role: _Optional[_Union[_types_pb2.Role, str]] = ..., ip: _Optional[str] = ..., admin_port: _Optional[int] = ..., engine_type: _Optional[_Union[_types_pb2.EngineType, str]] = ..., model_name: _Optional[str] = ..., node_rank: _Optional[int] = ..., nodes_per_instance: _Optional[int] = ..., endpoints: _Optional[_Iterable[_Union[_types_pb2.Endpoint, _Mapping]]] = ..., capabilities: _Optional[_Union[Capabilities, _Mapping]] = ..., local_world_size: _Optional[int] = ...) -> None: ...

class RegisterNodeRequest(_message.Message):
    __slots__ = ("node", "request_id")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    node: NodeSpec
    request_id: str
    def __init__(self, node: _Optional[_Union[NodeSpec, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class RegisterNodeResponse(_message.Message):
    __slots__ = ("node_id", "heartbeat_interval_seconds", "controller_epoch")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    heartbeat_interval_seconds: float
    controller_epoch: str
    def __init__(self, node_id: _Optional[str] = ..., heartbeat_interval_seconds: _Optional[float] = ..., controller_epoch: _Optional[str] = ...) -> None: ...

class EndpointHealth(_message.Message):
    __slots__ = ("endpoint_id", "status", "generation", "pid", "was_normal", "detail")
    ENDPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    WAS_NORMAL_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    endpoint_id: int
    status: _types_pb2.EndpointStatus
    generation: int
    pid: int
    was_normal: bool
    detail: str
    def __init__(self, endpoint_id: _Optional[int] = ..., status: _Optional[_Union[_types_pb2.EndpointStatus, str]] = ..., generation: _Optional[int] = ..., pid: _Optional[int] = ..., was_normal: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "sequence", "state", "instance_id", "endpoints", "sent_at", "relaunch_count")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    RELAUNCH_COUNT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    sequence: int
    state: NodeState
    instance_id: int
    endpoints: _containers.RepeatedCompositeFieldContainer[EndpointHealth]
    sent_at: _timestamp_pb2.Timestamp
    relaunch_count: int
    def __init__(self, node_id: _Optional[str] = ..., sequence: _Optional[int] = ..., state: _Optional[_Union[NodeState, str]] = ..., instance_id: _Optional[int] = ..., endpoints: _Optional[_Iterable[_Union[EndpointHealth, _Mapping]]] = ..., sent_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., relaunch_count: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("acked_sequence", "command", "message")
    ACKED_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    acked_sequence: int
    command: HeartbeatCommand
    message: str
    def __init__(self, acked_sequence: _Optional[int] = ..., command: _Optional[_Union[HeartbeatCommand, str]] = ..., message: _Optional[str] = ...) -> None: ...

class ReportFaultRequest(_message.Message):
    __slots__ = ("node_id", "instance_id", "endpoint_id", "level", "source", "pid", "detail", "request_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    instance_id: int
    endpoint_id: int
    level: FaultLevel
    source: FaultSource
    pid: int
    detail: str
    request_id: str
    def __init__(self, node_id: _Optional[str] = ..., instance_id: _Optional[int] = ..., endpoint_id: _Optional[int] = ..., level: _Optional[_Union[FaultLevel, str]] = ..., source: _Optional[_Union[FaultSource, str]] = ..., pid: _Optional[int] = ..., detail: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class ReportFaultResponse(_message.Message):
    __slots__ = ("accepted", "relaunch_expected")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    RELAUNCH_EXPECTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    relaunch_expected: bool
    def __init__(self, accepted: _Optional[bool] = ..., relaunch_expected: _Optional[bool] = ...) -> None: ...

class Alarm(_message.Message):
    __slots__ = ("kind", "action", "source", "instance_ids", "address", "message", "raised_at")
    KIND_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_IDS_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RAISED_AT_FIELD_NUMBER: _ClassVar[int]
    kind: AlarmKind
    action: AlarmAction
    source: str
    instance_ids: _containers.RepeatedScalarFieldContainer[int]
    address: str
    message: str
    raised_at: _timestamp_pb2.Timestamp
    def __init__(self, kind: _Optional[_Union[AlarmKind, str]] = ..., action: _Optional[_Union[AlarmAction, str]] = ..., source: _Optional[str] = ..., instance_ids: _Optional[_Iterable[int]] = ..., address: _Optional[str] = ..., message: _Optional[str] = ..., raised_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ReportAlarmRequest(_message.Message):
    __slots__ = ("alarm", "request_id")
    ALARM_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    alarm: Alarm
    request_id: str
    def __init__(self, alarm: _Optional[_Union[Alarm, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ReportAlarmResponse(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: _Optional[bool] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("spec", "state", "instance_id", "endpoints", "last_heartbeat_at", "registered_at")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AT_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    spec: NodeSpec
    state: NodeState
    instance_id: int
    endpoints: _containers.RepeatedCompositeFieldContainer[EndpointHealth]
    last_heartbeat_at: _timestamp_pb2.Timestamp
    registered_at: _timestamp_pb2.Timestamp
    def __init__(self, spec: _Optional[_Union[NodeSpec, _Mapping]] = ..., state: _Optional[_Union[NodeState, str]] = ..., instance_id: _Optional[int] = ..., endpoints: _Optional[_Iterable[_Union[EndpointHealth, _Mapping]]] = ..., last_heartbeat_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., registered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ("job_name", "page_size", "page_token")
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    job_name: str
    page_size: int
    page_token: str
    def __init__(self, job_name: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes", "next_page_token")
    NODES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    next_page_token: str
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ManagedInstance(_message.Message):
    __slots__ = ("instance", "state", "node_ids", "master_address", "state_changed_at", "reason", "paused", "pause_reason", "paused_at")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_CHANGED_AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    PAUSE_REASON_FIELD_NUMBER: _ClassVar[int]
    PAUSED_AT_FIELD_NUMBER: _ClassVar[int]
    instance: _types_pb2.Instance
    state: InstanceState
    node_ids: _containers.RepeatedScalarFieldContainer[str]
    master_address: str
    state_changed_at: _timestamp_pb2.Timestamp
    reason: str
    paused: bool
    pause_reason: str
    paused_at: _timestamp_pb2.Timestamp
    def __init__(self, instance: _Optional[_Union[_types_pb2.Instance, _Mapping]] = ..., state: _Optional[_Union[InstanceState, str]] = ..., node_ids: _Optional[_Iterable[str]] = ..., master_address: _Optional[str] = ..., state_changed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ..., paused: _Optional[bool] = ..., pause_reason: _Optional[str] = ..., paused_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListInstancesRequest(_message.Message):
    __slots__ = ("job_name", "page_size", "page_token")
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    job_name: str
    page_size: int
    page_token: str
    def __init__(self, job_name: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListInstancesResponse(_message.Message):
    __slots__ = ("instances", "next_page_token")
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[ManagedInstance]
    next_page_token: str
    def __init__(self, instances: _Optional[_Iterable[_Union[ManagedInstance, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetInstanceRequest(_message.Message):
    __slots__ = ("instance_id",)
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    instance_id: int
    def __init__(self, instance_id: _Optional[int] = ...) -> None: ...

class GetInstanceResponse(_message.Message):
    __slots__ = ("instance",)
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    instance: ManagedInstance
    def __init__(self, instance: _Optional[_Union[ManagedInstance, _Mapping]] = ...) -> None: ...

class TerminateInstanceRequest(_message.Message):
    __slots__ = ("instance_id", "precision_alarm_clear", "reason", "request_id")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    PRECISION_ALARM_CLEAR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    instance_id: int
    precision_alarm_clear: bool
    reason: str
    request_id: str
    def __init__(self, instance_id: _Optional[int] = ..., precision_alarm_clear: _Optional[bool] = ..., reason: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class TerminateInstanceResponse(_message.Message):
    __slots__ = ("stopped_node_ids",)
    STOPPED_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    stopped_node_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, stopped_node_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GetFaultToleranceStatusRequest(_message.Message):
    __slots__ = ("instance_id",)
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    instance_id: int
    def __init__(self, instance_id: _Optional[int] = ...) -> None: ...

class GetFaultToleranceStatusResponse(_message.Message):
    __slots__ = ("state", "strategy", "phase", "relaunch_attempts", "retired_dp_ranks", "last_error")
    STATE_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    RELAUNCH_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    RETIRED_DP_RANKS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    state: FaultToleranceState
    strategy: str
    phase: str
    relaunch_attempts: int
    retired_dp_ranks: _containers.RepeatedScalarFieldContainer[int]
    last_error: str
    def __init__(self, state: _Optional[_Union[FaultToleranceState, str]] = ..., strategy: _Optional[str] = ..., phase: _Optional[str] = ..., relaunch_attempts: _Optional[int] = ..., retired_dp_ranks: _Optional[_Iterable[int]] = ..., last_error: _Optional[str] = ...) -> None: ...

class ListAlarmsRequest(_message.Message):
    __slots__ = ("active_only", "page_size", "page_token")
    ACTIVE_ONLY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    active_only: bool
    page_size: int
    page_token: str
    def __init__(self, active_only: _Optional[bool] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListAlarmsResponse(_message.Message):
    __slots__ = ("alarms", "next_page_token")
    ALARMS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    alarms: _containers.RepeatedCompositeFieldContainer[Alarm]
    next_page_token: str
    def __init__(self, alarms: _Optional[_Iterable[_Union[Alarm, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class PauseInstanceRequest(_message.Message):
    __slots__ = ("instance_id", "reason", "request_id", "node_id")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    instance_id: int
    reason: str
    request_id: str
    node_id: str
    def __init__(self, instance_id: _Optional[int] = ..., reason: _Optional[str] = ..., request_id: _Optional[str] = ..., node_id: _Optional[str] = ...) -> None: ...

class PauseInstanceResponse(_message.Message):
    __slots__ = ("instance",)
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    instance: ManagedInstance
    def __init__(self, instance: _Optional[_Union[ManagedInstance, _Mapping]] = ...) -> None: ...

class ResumeInstanceRequest(_message.Message):
    __slots__ = ("instance_id", "request_id", "node_id")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    instance_id: int
    request_id: str
    node_id: str
    def __init__(self, instance_id: _Optional[int] = ..., request_id: _Optional[str] = ..., node_id: _Optional[str] = ...) -> None: ...

class ResumeInstanceResponse(_message.Message):
    __slots__ = ("instance", "paused_node_ids")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    instance: ManagedInstance
    paused_node_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, instance: _Optional[_Union[ManagedInstance, _Mapping]] = ..., paused_node_ids: _Optional[_Iterable[str]] = ...) -> None: ...
