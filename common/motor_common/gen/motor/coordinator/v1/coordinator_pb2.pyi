from motor_common.gen.motor.common.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OpenAiApi(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPEN_AI_API_UNSPECIFIED: _ClassVar[OpenAiApi]
    OPEN_AI_API_COMPLETIONS: _ClassVar[OpenAiApi]
    OPEN_AI_API_CHAT_COMPLETIONS: _ClassVar[OpenAiApi]
    OPEN_AI_API_EMBEDDINGS: _ClassVar[OpenAiApi]
    OPEN_AI_API_RESPONSES: _ClassVar[OpenAiApi]
    OPEN_AI_API_TOKENIZE: _ClassVar[OpenAiApi]
    OPEN_AI_API_DETOKENIZE: _ClassVar[OpenAiApi]
    OPEN_AI_API_VERSION: _ClassVar[OpenAiApi]
    OPEN_AI_API_RESPONSES_RETRIEVE: _ClassVar[OpenAiApi]
    OPEN_AI_API_RESPONSES_CANCEL: _ClassVar[OpenAiApi]

class CoordinatorRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COORDINATOR_ROLE_UNSPECIFIED: _ClassVar[CoordinatorRole]
    COORDINATOR_ROLE_STANDALONE: _ClassVar[CoordinatorRole]
    COORDINATOR_ROLE_MASTER: _ClassVar[CoordinatorRole]
    COORDINATOR_ROLE_STANDBY: _ClassVar[CoordinatorRole]
OPEN_AI_API_UNSPECIFIED: OpenAiApi
OPEN_AI_API_COMPLETIONS: OpenAiApi
OPEN_AI_API_CHAT_COMPLETIONS: OpenAiApi
OPEN_AI_API_EMBEDDINGS: OpenAiApi
OPEN_AI_API_RESPONSES: OpenAiApi
OPEN_AI_API_TOKENIZE: OpenAiApi
OPEN_AI_API_DETOKENIZE: OpenAiApi
OPEN_AI_API_VERSION: OpenAiApi
OPEN_AI_API_RESPONSES_RETRIEVE: OpenAiApi
OPEN_AI_API_RESPONSES_CANCEL: OpenAiApi
COORDINATOR_ROLE_UNSPECIFIED: CoordinatorRole
COORDINATOR_ROLE_STANDALONE: CoordinatorRole
COORDINATOR_ROLE_MASTER: CoordinatorRole
COORDINATOR_ROLE_STANDBY: CoordinatorRole

class SetInstancesRequest(_message.Message):
    __slots__ = ("instances", "generation", "request_id", "if_generation")
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    IF_GENERATION_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[_types_pb2.Instance]
    generation: int
    request_id: str
    if_generation: int
    def __init__(self, instances: _Optional[_Iterable[_Union[_types_pb2.Instance, _Mapping]]] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., if_generation: _Optional[int] = ...) -> None: ...

class SetInstancesResponse(_message.Message):
    __slots__ = ("generation", "instance_count")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_COUNT_FIELD_NUMBER: _ClassVar[int]
    generation: int
    instance_count: int
    def __init__(self, generation: _Optional[int] = ..., instance_count: _Optional[int] = ...) -> None: ...

class AddInstancesRequest(_message.Message):
    __slots__ = ("instances", "generation", "request_id", "if_generation")
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    IF_GENERATION_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[_types_pb2.Instance]
    generation: int
    request_id: str
    if_generation: int
    def __init__(self, instances: _Optional[_Iterable[_Union[_types_pb2.Instance, _Mapping]]] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., if_generation: _Optional[int] = ...) -> None: ...

class AddInstancesResponse(_message.Message):
    __slots__ = ("generation", "added_ids")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ADDED_IDS_FIELD_NUMBER: _ClassVar[int]
    generation: int
    added_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, generation: _Optional[int] = ..., added_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DeleteInstancesRequest(_message.Message):
    __slots__ = ("instances", "generation", "request_id", "if_generation")
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    IF_GENERATION_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[_types_pb2.Instance]
    generation: int
    request_id: str
    if_generation: int
    def __init__(self, instances: _Optional[_Iterable[_Union[_types_pb2.Instance, _Mapping]]] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., if_generation: _Optional[int] = ...) -> None: ...

class DeleteInstancesResponse(_message.Message):
    __slots__ = ("generation", "deleted_ids")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    DELETED_IDS_FIELD_NUMBER: _ClassVar[int]
    generation: int
    deleted_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, generation: _Optional[int] = ..., deleted_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PauseInstancesRequest(_message.Message):
    __slots__ = ("instance_ids", "generation", "request_id")
    INSTANCE_IDS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    instance_ids: _containers.RepeatedScalarFieldContainer[int]
    generation: int
    request_id: str
    def __init__(self, instance_ids: _Optional[_Iterable[int]] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class PauseInstancesResponse(_message.Message):
    __slots__ = ("generation",)
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    generation: int
    def __init__(self, generation: _Optional[int] = ...) -> None: ...

class ResumeInstancesRequest(_message.Message):
    __slots__ = ("instance_ids", "generation", "request_id")
    INSTANCE_IDS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    instance_ids: _containers.RepeatedScalarFieldContainer[int]
    generation: int
    request_id: str
    def __init__(self, instance_ids: _Optional[_Iterable[int]] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class ResumeInstancesResponse(_message.Message):
    __slots__ = ("generation",)
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    generation: int
    def __init__(self, generation: _Optional[int] = ...) -> None: ...

class ListInstancesRequest(_message.Message):
    __slots__ = ("role", "page_size", "page_token")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    role: _types_pb2.Role
    page_size: int
    page_token: str
    def __init__(self, role: _Optional[_Union[_types_pb2.Role, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class InstanceSummary(_message.Message):
    __slots__ = ("available", "unavailable", "paused", "prefill", "decode", "union_instances")
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    DECODE_FIELD_NUMBER: _ClassVar[int]
    UNION_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    available: int
    unavailable: int
    paused: int
    prefill: int
    decode: int
    union_instances: int
    def __init__(self, available: _Optional[int] = ..., unavailable: _Optional[int] = ..., paused: _Optional[int] = ..., prefill: _Optional[int] = ..., decode: _Optional[int] = ..., union_instances: _Optional[int] = ...) -> None: ...

class ListInstancesResponse(_message.Message):
    __slots__ = ("instances", "summary", "generation", "next_page_token")
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[_types_pb2.Instance]
    summary: InstanceSummary
    generation: int
    next_page_token: str
    def __init__(self, instances: _Optional[_Iterable[_Union[_types_pb2.Instance, _Mapping]]] = ..., summary: _Optional[_Union[InstanceSummary, _Mapping]] = ..., generation: _Optional[int] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetInstanceRequest(_message.Message):
    __slots__ = ("instance_id",)
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    instance_id: int
    def __init__(self, instance_id: _Optional[int] = ...) -> None: ...

class GetInstanceResponse(_message.Message):
    __slots__ = ("instance",)
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    instance: _types_pb2.Instance
    def __init__(self, instance: _Optional[_Union[_types_pb2.Instance, _Mapping]] = ...) -> None: ...

class ClearPrecisionAlarmsRequest(_message.Message):
    __slots__ = ("instance_ids", "request_id")
    INSTANCE_IDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    instance_ids: _containers.RepeatedScalarFieldContainer[int]
    request_id: str
    def __init__(self, instance_ids: _Optional[_Iterable[int]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ClearPrecisionAlarmsResponse(_message.Message):
    __slots__ = ("cleared",)
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    cleared: int
    def __init__(self, cleared: _Optional[int] = ...) -> None: ...

class DispatchRequest(_message.Message):
    __slots__ = ("request_id", "api", "body")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    API_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    api: OpenAiApi
    body: bytes
    def __init__(self, request_id: _Optional[str] = ..., api: _Optional[_Union[OpenAiApi, str]] = ..., body: _Optional[bytes] = ...) -> None: ...

class ResponseHead(_message.Message):
    __slots__ = ("http_status", "content_type", "request_id", "prefill_instance_id", "decode_instance_id")
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PREFILL_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    DECODE_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    http_status: int
    content_type: str
    request_id: str
    prefill_instance_id: int
    decode_instance_id: int
    def __init__(self, http_status: _Optional[int] = ..., content_type: _Optional[str] = ..., request_id: _Optional[str] = ..., prefill_instance_id: _Optional[int] = ..., decode_instance_id: _Optional[int] = ...) -> None: ...

class DispatchResponse(_message.Message):
    __slots__ = ("head", "chunk")
    HEAD_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    head: ResponseHead
    chunk: bytes
    def __init__(self, head: _Optional[_Union[ResponseHead, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class DispatchManyRequest(_message.Message):
    __slots__ = ("commands",)
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    commands: _containers.RepeatedCompositeFieldContainer[DispatchCommand]
    def __init__(self, commands: _Optional[_Iterable[_Union[DispatchCommand, _Mapping]]] = ...) -> None: ...

class DispatchCommand(_message.Message):
    __slots__ = ("stream_id", "start", "cancel", "credit")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    start: DispatchStart
    cancel: bool
    credit: int
    def __init__(self, stream_id: _Optional[int] = ..., start: _Optional[_Union[DispatchStart, _Mapping]] = ..., cancel: _Optional[bool] = ..., credit: _Optional[int] = ...) -> None: ...

class DispatchStart(_message.Message):
    __slots__ = ("request", "timeout_ms", "degraded", "trace_context", "window_bytes")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_BYTES_FIELD_NUMBER: _ClassVar[int]
    request: DispatchRequest
    timeout_ms: int
    degraded: bool
    trace_context: _containers.ScalarMap[str, str]
    window_bytes: int
    def __init__(self, request: _Optional[_Union[DispatchRequest, _Mapping]] = ..., timeout_ms: _Optional[int] = ..., degraded: _Optional[bool] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., window_bytes: _Optional[int] = ...) -> None: ...

class DispatchManyResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[DispatchEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[DispatchEvent, _Mapping]]] = ...) -> None: ...

class DispatchEvent(_message.Message):
    __slots__ = ("stream_id", "frame", "end", "error")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    frame: DispatchResponse
    end: bool
    error: DispatchError
    def __init__(self, stream_id: _Optional[int] = ..., frame: _Optional[_Union[DispatchResponse, _Mapping]] = ..., end: _Optional[bool] = ..., error: _Optional[_Union[DispatchError, _Mapping]] = ...) -> None: ...

class DispatchError(_message.Message):
    __slots__ = ("code", "message", "reason", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    reason: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., reason: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Model(_message.Message):
    __slots__ = ("id", "created", "prefill_instances", "decode_instances", "union_instances", "max_model_len", "root", "parent", "permission")
    ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    PREFILL_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    DECODE_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    UNION_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    id: str
    created: int
    prefill_instances: int
    decode_instances: int
    union_instances: int
    max_model_len: int
    root: str
    parent: str
    permission: _containers.RepeatedCompositeFieldContainer[ModelPermission]
    def __init__(self, id: _Optional[str] = ..., created: _Optional[int] = ..., prefill_instances: _Optional[int] = ..., decode_instances: _Optional[int] = ..., union_instances: _Optional[int] = ..., max_model_len: _Optional[int] = ..., root: _Optional[str] = ..., parent: _Optional[str] = ..., permission: _Optional[_Iterable[_Union[ModelPermission, _Mapping]]] = ...) -> None: ...

class ModelPermission(_message.Message):
    __slots__ = ("id", "created", "allow_create_engine", "allow_sampling", "allow_logprobs", "allow_search_indices", "allow_view", "allow_fine_tuning", "organization", "group", "is_blocking")
    ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    ALLOW_CREATE_ENGINE_FIELD_NUMBER: _ClassVar[int]
    ALLOW_SAMPLING_FIELD_NUMBER: _ClassVar[int]
    ALLOW_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_SEARCH_INDICES_FIELD_NUMBER: _ClassVar[int]
    ALLOW_VIEW_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FINE_TUNING_FIELD_NUMBER: _ClassVar[int]
    ORGANIZATION_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    IS_BLOCKING_FIELD_NUMBER: _ClassVar[int]
    id: str
    created: int
    allow_create_engine: bool
    allow_sampling: bool
    allow_logprobs: bool
    allow_search_indices: bool
    allow_view: bool
    allow_fine_tuning: bool
    organization: str
    group: str
    is_blocking: bool
    def __init__(self, id: _Optional[str] = ..., created: _Optional[int] = ..., allow_create_engine: _Optional[bool] = ..., allow_sampling: _Optional[bool] = ..., allow_logprobs: _Optional[bool] = ..., allow_search_indices: _Optional[bool] = ..., allow_view: _Optional[bool] = ..., allow_fine_tuning: _Optional[bool] = ..., organization: _Optional[str] = ..., group: _Optional[str] = ..., is_blocking: _Optional[bool] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[Model]
    def __init__(self, models: _Optional[_Iterable[_Union[Model, _Mapping]]] = ...) -> None: ...

class GetReadinessRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetReadinessResponse(_message.Message):
    __slots__ = ("ready", "reason", "role", "isolated", "generation", "store_available", "available_instances", "advertise_address", "served_alone")
    READY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ISOLATED_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STORE_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    ADVERTISE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SERVED_ALONE_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    reason: str
    role: CoordinatorRole
    isolated: bool
    generation: int
    store_available: bool
    available_instances: int
    advertise_address: str
    served_alone: _containers.RepeatedCompositeFieldContainer[ServedAlone]
    def __init__(self, ready: _Optional[bool] = ..., reason: _Optional[str] = ..., role: _Optional[_Union[CoordinatorRole, str]] = ..., isolated: _Optional[bool] = ..., generation: _Optional[int] = ..., store_available: _Optional[bool] = ..., available_instances: _Optional[int] = ..., advertise_address: _Optional[str] = ..., served_alone: _Optional[_Iterable[_Union[ServedAlone, _Mapping]]] = ...) -> None: ...

class ServedAlone(_message.Message):
    __slots__ = ("model", "role")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    model: str
    role: _types_pb2.Role
    def __init__(self, model: _Optional[str] = ..., role: _Optional[_Union[_types_pb2.Role, str]] = ...) -> None: ...
