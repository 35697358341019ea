from motor_common.gen.motor.common.v1 import types_pb2 as _types_pb2
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as _coordinator_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EndpointLoad(_message.Message):
    __slots__ = ("ip", "port", "in_flight", "queued_tokens")
    IP_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ip: str
    port: int
    in_flight: int
    queued_tokens: int
    def __init__(self, ip: _Optional[str] = ..., port: _Optional[int] = ..., in_flight: _Optional[int] = ..., queued_tokens: _Optional[int] = ...) -> None: ...

class SyncRequest(_message.Message):
    __slots__ = ("worker_index", "loads")
    WORKER_INDEX_FIELD_NUMBER: _ClassVar[int]
    LOADS_FIELD_NUMBER: _ClassVar[int]
    worker_index: int
    loads: _containers.RepeatedCompositeFieldContainer[EndpointLoad]
    def __init__(self, worker_index: _Optional[int] = ..., loads: _Optional[_Iterable[_Union[EndpointLoad, _Mapping]]] = ...) -> None: ...

class FrontWorkerRegistry(_message.Message):
    __slots__ = ("generation", "instances", "authoritative", "managed")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    AUTHORITATIVE_FIELD_NUMBER: _ClassVar[int]
    MANAGED_FIELD_NUMBER: _ClassVar[int]
    generation: int
    instances: _containers.RepeatedCompositeFieldContainer[_types_pb2.Instance]
    authoritative: bool
    managed: bool
    def __init__(self, generation: _Optional[int] = ..., instances: _Optional[_Iterable[_Union[_types_pb2.Instance, _Mapping]]] = ..., authoritative: _Optional[bool] = ..., managed: _Optional[bool] = ...) -> None: ...

class FrontWorkerLeadership(_message.Message):
    __slots__ = ("role", "isolated", "store_available", "master_valid_until")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ISOLATED_FIELD_NUMBER: _ClassVar[int]
    STORE_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    MASTER_VALID_UNTIL_FIELD_NUMBER: _ClassVar[int]
    role: _coordinator_pb2.CoordinatorRole
    isolated: bool
    store_available: bool
    master_valid_until: float
    def __init__(self, role: _Optional[_Union[_coordinator_pb2.CoordinatorRole, str]] = ..., isolated: _Optional[bool] = ..., store_available: _Optional[bool] = ..., master_valid_until: _Optional[float] = ...) -> None: ...

class PrecisionGroup(_message.Message):
    __slots__ = ("instance_ids",)
    INSTANCE_IDS_FIELD_NUMBER: _ClassVar[int]
    instance_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, instance_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class FrontWorkerAlarms(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[PrecisionGroup]
    def __init__(self, groups: _Optional[_Iterable[_Union[PrecisionGroup, _Mapping]]] = ...) -> None: ...

class SyncResponse(_message.Message):
    __slots__ = ("registry", "leadership", "alarms")
    REGISTRY_FIELD_NUMBER: _ClassVar[int]
    LEADERSHIP_FIELD_NUMBER: _ClassVar[int]
    ALARMS_FIELD_NUMBER: _ClassVar[int]
    registry: FrontWorkerRegistry
    leadership: FrontWorkerLeadership
    alarms: FrontWorkerAlarms
    def __init__(self, registry: _Optional[_Union[FrontWorkerRegistry, _Mapping]] = ..., leadership: _Optional[_Union[FrontWorkerLeadership, _Mapping]] = ..., alarms: _Optional[_Union[FrontWorkerAlarms, _Mapping]] = ...) -> None: ...
