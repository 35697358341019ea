from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_PREFILL: _ClassVar[Role]
    ROLE_DECODE: _ClassVar[Role]
    ROLE_UNION: _ClassVar[Role]

class EngineType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENGINE_TYPE_UNSPECIFIED: _ClassVar[EngineType]
    ENGINE_TYPE_VLLM: _ClassVar[EngineType]
    ENGINE_TYPE_SGLANG: _ClassVar[EngineType]

class InstanceStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INSTANCE_STATUS_UNSPECIFIED: _ClassVar[InstanceStatus]
    INSTANCE_STATUS_AVAILABLE: _ClassVar[InstanceStatus]
    INSTANCE_STATUS_UNAVAILABLE: _ClassVar[InstanceStatus]
    INSTANCE_STATUS_PAUSED: _ClassVar[InstanceStatus]

class EndpointStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENDPOINT_STATUS_UNSPECIFIED: _ClassVar[EndpointStatus]
    ENDPOINT_STATUS_INITIAL: _ClassVar[EndpointStatus]
    ENDPOINT_STATUS_NORMAL: _ClassVar[EndpointStatus]
    ENDPOINT_STATUS_ABNORMAL: _ClassVar[EndpointStatus]
    ENDPOINT_STATUS_PAUSED: _ClassVar[EndpointStatus]
    ENDPOINT_STATUS_RETIRED: _ClassVar[EndpointStatus]
ROLE_UNSPECIFIED: Role
ROLE_PREFILL: Role
ROLE_DECODE: Role
ROLE_UNION: Role
ENGINE_TYPE_UNSPECIFIED: EngineType
ENGINE_TYPE_VLLM: EngineType
ENGINE_TYPE_SGLANG: EngineType
INSTANCE_STATUS_UNSPECIFIED: InstanceStatus
INSTANCE_STATUS_AVAILABLE: InstanceStatus
INSTANCE_STATUS_UNAVAILABLE: InstanceStatus
INSTANCE_STATUS_PAUSED: InstanceStatus
ENDPOINT_STATUS_UNSPECIFIED: EndpointStatus
ENDPOINT_STATUS_INITIAL: EndpointStatus
ENDPOINT_STATUS_NORMAL: EndpointStatus
ENDPOINT_STATUS_ABNORMAL: EndpointStatus
ENDPOINT_STATUS_PAUSED: EndpointStatus
ENDPOINT_STATUS_RETIRED: EndpointStatus

class Endpoint(_message.Message):
    __slots__ = ("id", "ip", "business_port", "bootstrap_port", "kv_port", "dp_rank", "node_id", "kv_events_port", "kv_events_replay_port")
    ID_FIELD_NUMBER: _ClassVar[int]
    IP_FIELD_NUMBER: _ClassVar[int]
    BUSINESS_PORT_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAP_PORT_FIELD_NUMBER: _ClassVar[int]
    KV_PORT_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    KV_EVENTS_PORT_FIELD_NUMBER: _ClassVar[int]
    KV_EVENTS_REPLAY_PORT_FIELD_NUMBER: _ClassVar[int]
    id: int
    ip: str
    business_port: int
    bootstrap_port: int
    kv_port: int
    dp_rank: int
    node_id: str
    kv_events_port: int
    kv_events_replay_port: int
    def __init__(self, id: _Optional[int] = ..., ip: _Optional[str] = ..., business_port: _Optional[int] = ..., bootstrap_port: _Optional[int] = ..., kv_port: _Optional[int] = ..., dp_rank: _Optional[int] = ..., node_id: _Optional[str] = ..., kv_events_port: _Optional[int] = ..., kv_events_replay_port: _Optional[int] = ...) -> None: ...

class Instance(_message.Message):
    __slots__ = ("id", "role", "job_name", "model_name", "engine_type", "endpoints", "status")
    ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    ENGINE_TYPE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    id: int
    role: Role
    job_name: str
    model_name: str
    engine_type: EngineType
    endpoints: _containers.RepeatedCompositeFieldContainer[Endpoint]
    status: InstanceStatus
    def __init__(self, id: _Optional[int] = ..., role: _Optional[_Union[Role, str]] = ..., job_name: _Optional[str] = ..., model_name: _Optional[str] = ..., engine_type: _Optional[_Union[EngineType, str]] = ..., endpoints: _Optional[_Iterable[_Union[Endpoint, _Mapping]]] = ..., status: _Optional[_Union[InstanceStatus, str]] = ...) -> None: ...
