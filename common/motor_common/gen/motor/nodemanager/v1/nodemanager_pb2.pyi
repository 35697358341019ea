import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from motor_common.gen.motor.common.v1 import types_pb2 as _types_pb2
from motor_common.gen.motor.controller.v1 import controller_pb2 as _controller_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RestartAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESTART_ACTION_UNSPECIFIED: _ClassVar[RestartAction]
    RESTART_ACTION_RESTART: _ClassVar[RestartAction]
    RESTART_ACTION_ABORT: _ClassVar[RestartAction]

class ScaleDownDecision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCALE_DOWN_DECISION_UNSPECIFIED: _ClassVar[ScaleDownDecision]
    SCALE_DOWN_DECISION_COMMIT: _ClassVar[ScaleDownDecision]
    SCALE_DOWN_DECISION_ABORT: _ClassVar[ScaleDownDecision]

class ScaleDownState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCALE_DOWN_STATE_UNSPECIFIED: _ClassVar[ScaleDownState]
    SCALE_DOWN_STATE_DISABLED: _ClassVar[ScaleDownState]
    SCALE_DOWN_STATE_IDLE: _ClassVar[ScaleDownState]
    SCALE_DOWN_STATE_GUARDED: _ClassVar[ScaleDownState]
    SCALE_DOWN_STATE_APPLYING: _ClassVar[ScaleDownState]
    SCALE_DOWN_STATE_HEALTHY: _ClassVar[ScaleDownState]
    SCALE_DOWN_STATE_UNHEALTHY: _ClassVar[ScaleDownState]
RESTART_ACTION_UNSPECIFIED: RestartAction
RESTART_ACTION_RESTART: RestartAction
RESTART_ACTION_ABORT: RestartAction
SCALE_DOWN_DECISION_UNSPECIFIED: ScaleDownDecision
SCALE_DOWN_DECISION_COMMIT: ScaleDownDecision
SCALE_DOWN_DECISION_ABORT: ScaleDownDecision
SCALE_DOWN_STATE_UNSPECIFIED: ScaleDownState
SCALE_DOWN_STATE_DISABLED: ScaleDownState
SCALE_DOWN_STATE_IDLE: ScaleDownState
SCALE_DOWN_STATE_GUARDED: ScaleDownState
SCALE_DOWN_STATE_APPLYING: ScaleDownState
SCALE_DOWN_STATE_HEALTHY: ScaleDownState
SCALE_DOWN_STATE_UNHEALTHY: ScaleDownState

class StartEnginesRequest(_message.Message):
    __slots__ = ("instance_id", "job_name", "role", "engine_type", "model_name", "endpoints", "node_rank", "num_nodes", "master_address", "master_port", "dp_size", "generation", "peers", "request_id")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_TYPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    NODE_RANK_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    DP_SIZE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    instance_id: int
    job_name: str
    role: _types_pb2.Role
    engine_type: _types_pb2.EngineType
    model_name: str
    endpoints: _containers.RepeatedCompositeFieldContainer[_types_pb2.Endpoint]
    node_rank: int
    num_nodes: int
    master_address: str
    master_port: int
    dp_size: int
    generation: int
    peers: _containers.RepeatedCompositeFieldContainer[_types_pb2.Endpoint]
    request_id: str
    def __init__(self, instance_id: _Optional[int] = ..., job_name: _Optional[str] = ..., role: _Optional[_Union[_types_pb2.Role, str]] = ..., engine_type: _Optional[_Union[_types_pb2.EngineType, str]] = ..., model_name: _Optional[str] = ..., endpoints: _Optional[_Iterable[_Union[_types_pb2.Endpoint, _Mapping]]] = ..., node_rank: _Optional[int] = ..., num_nodes: _Optional[int] = ..., master_address: _Optional[str] = ..., master_port: _Optional[int] = ..., dp_size: _Optional[int] = ..., generation: _Optional[int] = ..., peers: _Optional[_Iterable[_Union[_types_pb2.Endpoint, _Mapping]]] = ..., request_id: _Optional[str] = ...) -> None: ...

class StartEnginesResponse(_message.Message):
    __slots__ = ("pids",)
    PIDS_FIELD_NUMBER: _ClassVar[int]
    pids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, pids: _Optional[_Iterable[int]] = ...) -> None: ...

class StopNodeRequest(_message.Message):
    __slots__ = ("reason", "request_id")
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    reason: str
    request_id: str
    def __init__(self, reason: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class StopNodeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PauseNodeRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class PauseNodeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResumeNodeRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class ResumeNodeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("node_id", "state", "instance_id", "endpoints", "frozen", "freeze_deadline", "relaunch_count", "registered")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    FROZEN_FIELD_NUMBER: _ClassVar[int]
    FREEZE_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    RELAUNCH_COUNT_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    state: _controller_pb2.NodeState
    instance_id: int
    endpoints: _containers.RepeatedCompositeFieldContainer[_controller_pb2.EndpointHealth]
    frozen: bool
    freeze_deadline: _timestamp_pb2.Timestamp
    relaunch_count: int
    registered: bool
    def __init__(self, node_id: _Optional[str] = ..., state: _Optional[_Union[_controller_pb2.NodeState, str]] = ..., instance_id: _Optional[int] = ..., endpoints: _Optional[_Iterable[_Union[_controller_pb2.EndpointHealth, _Mapping]]] = ..., frozen: _Optional[bool] = ..., freeze_deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., relaunch_count: _Optional[int] = ..., registered: _Optional[bool] = ...) -> None: ...

class GetReadinessRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetReadinessResponse(_message.Message):
    __slots__ = ("ready", "reason")
    READY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    reason: str
    def __init__(self, ready: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class RestartEngineRequest(_message.Message):
    __slots__ = ("action", "instance_id", "request_id")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    action: RestartAction
    instance_id: int
    request_id: str
    def __init__(self, action: _Optional[_Union[RestartAction, str]] = ..., instance_id: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class RestartEngineResponse(_message.Message):
    __slots__ = ("relaunch_count", "pids")
    RELAUNCH_COUNT_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    relaunch_count: int
    pids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, relaunch_count: _Optional[int] = ..., pids: _Optional[_Iterable[int]] = ...) -> None: ...

class GuardScaleDownRequest(_message.Message):
    __slots__ = ("request_id", "instance_id", "lease_seconds", "dead_dp_ranks")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DEAD_DP_RANKS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    instance_id: int
    lease_seconds: float
    dead_dp_ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., instance_id: _Optional[int] = ..., lease_seconds: _Optional[float] = ..., dead_dp_ranks: _Optional[_Iterable[int]] = ...) -> None: ...

class GuardScaleDownResponse(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: _Optional[bool] = ...) -> None: ...

class ApplyScaleDownRequest(_message.Message):
    __slots__ = ("request_id", "instance_id", "dead_dp_ranks")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    DEAD_DP_RANKS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    instance_id: int
    dead_dp_ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., instance_id: _Optional[int] = ..., dead_dp_ranks: _Optional[_Iterable[int]] = ...) -> None: ...

class ApplyScaleDownResponse(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: _Optional[bool] = ...) -> None: ...

class FinalizeScaleDownRequest(_message.Message):
    __slots__ = ("request_id", "instance_id", "decision")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    instance_id: int
    decision: ScaleDownDecision
    def __init__(self, request_id: _Optional[str] = ..., instance_id: _Optional[int] = ..., decision: _Optional[_Union[ScaleDownDecision, str]] = ...) -> None: ...

class FinalizeScaleDownResponse(_message.Message):
    __slots__ = ("retired_dp_ranks",)
    RETIRED_DP_RANKS_FIELD_NUMBER: _ClassVar[int]
    retired_dp_ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, retired_dp_ranks: _Optional[_Iterable[int]] = ...) -> None: ...

class GetScaleDownStatusRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class GetScaleDownStatusResponse(_message.Message):
    __slots__ = ("state", "request_id", "retired_dp_ranks")
    STATE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RETIRED_DP_RANKS_FIELD_NUMBER: _ClassVar[int]
    state: ScaleDownState
    request_id: str
    retired_dp_ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, state: _Optional[_Union[ScaleDownState, str]] = ..., request_id: _Optional[str] = ..., retired_dp_ranks: _Optional[_Iterable[int]] = ...) -> None: ...
