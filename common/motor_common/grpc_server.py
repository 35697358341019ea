"""The gRPC service chassis shared by controller, coordinator and nodemanager.

:class:`GrpcServer` is a ``grpc.aio`` server with, on by default:

- ``grpc.health.v1.Health`` (overall ``""`` and one status per registered service) and server
  reflection (v1 and v1alpha, descriptors with source comments, see :mod:`motor_common.reflection`),
  so ``grpcurl -plaintext HOST:PORT list`` works with no .proto files at hand. Health
  service ``"liveness"`` (:data:`LIVENESS_SERVICE`) is SERVING from start to graceful stop whatever
  :meth:`GrpcServer.set_serving` says: the liveness check (Kubernetes' gRPC probe with ``service:
  liveness``); ``""`` is the program's readiness (a standby coordinator or controller is NOT_SERVING
  there and stays alive);
- a management-key check for protected services (metadata ``x-motor-management-key``; missing or
  wrong key → UNAUTHENTICATED before the handler runs, so no state changes);
- translation of :class:`~motor_common.errors.MotorError` raised by handlers into a status with a
  ``google.rpc.ErrorInfo`` detail (unexpected exceptions → INTERNAL, logged);
- the request id (metadata ``x-request-id`` or a fresh one) in ``logs.request_id_var``;
- Prometheus metrics per RPC; optional TLS; graceful stop (drain for ``grace`` seconds, then cancel).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import grpc
from google.protobuf import any_pb2, descriptor_pool
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import Counter, Histogram

from motor_common.credentials import (
    AuthConfig,
    Authenticator,
    Credential,
    Principal,
    Role,
    audit,
    is_mutation,
    presented_key,
    read_key_text,
)
from motor_common.errors import (
    ConfigError,
    InvalidArgument,
    MotorError,
    PermissionDenied,
    Unauthenticated,
)
from motor_common.logs import new_request_id, request_id_var
from motor_common.ports import bind_error, bind_failure, host_port
from motor_common.reflection import add_reflection
from motor_common.request_limits import MAX_FIELDS, MEASURE_ABOVE_BYTES, check_request, count_fields
from motor_common.strict_proto import unknown_field_paths
from motor_common.tls import TlsConfig, server_credentials

log = logging.getLogger(__name__)

MANAGEMENT_KEY_HEADER = "x-motor-management-key"
AUTHORIZATION_HEADER = "authorization"
MAX_REQUEST_ID = 128


def valid_request_id(value: str) -> bool:
    """A client's request id is used (logs, responses) only when short and printable ASCII."""
    return 0 < len(value) <= MAX_REQUEST_ID and printable_id(value)


def printable_id(value: str) -> bool:
    """*value* is printable ASCII (no control bytes): safe in a log line and an HTTP header."""
    return value.isascii() and value.isprintable()


REQUEST_ID_HEADER = "x-request-id"
# The largest request message a server receives unless it asks for more (gRPC's own default). Every
# byte of a message can be a nested message: 4 MiB parse into ~2 million objects, 64 MiB into
# 30 million (seconds of the event loop and gigabytes), and an open method (health) let a caller
# without a key hold one such message per call.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
ERROR_DOMAIN = "motor.dev"

RPC_HANDLED = Counter(
    "motor_grpc_server_handled_total",
    "gRPC calls completed by this server, by method and status code.",
    ["service", "method", "code"],
)
RPC_SECONDS = Histogram(
    "motor_grpc_server_handling_seconds",
    "Time to complete a gRPC call on this server.",
    ["service", "method"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


# gRPC health service name of the liveness check: SERVING while the server runs, never toggled by
# readiness (the overall "" service is readiness).
LIVENESS_SERVICE = "liveness"


@dataclass(frozen=True)
class ServerConfig:
    """Listen address and security of a gRPC server (a section of each service's config).

    ``tls`` is the program's TLS identity (motor_common.tls): its server and its outbound channels.
    ``tls_cert_file``/``tls_key_file`` are the older spelling of ``tls.cert_file``/``tls.key_file``."""

    host: str = "127.0.0.1"
    port: int = 0
    tls: TlsConfig = field(default_factory=TlsConfig)
    # Operator, node and inference credentials (motor_common.credentials).
    auth: AuthConfig = field(default_factory=AuthConfig)
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    management_key_file: str | None = None
    grace_seconds: float = 5.0
    # Port of the HTTP ops endpoint (/metrics, /health, /ready); None = disabled, 0 = any.
    metrics_port: int | None = None
    # The ops endpoint's transport (motor_common.ops_http): "auto" = HTTPS with this program's
    # certificate whenever `tls` serves TLS (with require_client_cert, /metrics needs a client
    # certificate from tls.ca_file; /health and /ready answer probes without one), else plain HTTP;
    # "https" = HTTPS without client certificates on any route; "plaintext" = plain HTTP always.
    ops_tls: Literal["auto", "https", "plaintext"] = "auto"
    # Transport bounds (docs/security.md, "gRPC transport limits"): calls open at once in the whole
    # server (more → RESOURCE_EXHAUSTED), streams open at once on one connection (HTTP/2
    # MAX_CONCURRENT_STREAMS: a gRPC client queues more), connections at once, how long a connection
    # without a call stays open, and how long a new connection may take to start HTTP/2 (and TLS).
    max_concurrent_rpcs: int = 10_000
    max_streams_per_connection: int = 1_000
    max_connections: int = 4_096
    max_connection_idle_sec: float = 300.0
    handshake_timeout_sec: float = 20.0
    # The largest request message received; None = the program's default (4 MiB; a coordinator
    # 64 MiB, for Dispatch bodies). Every open call (health, a coordinator's GetReadiness: no key
    # needed) can make the server hold one message of this size while it arrives.
    max_message_bytes: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is outside [0, 65535]")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:  # 70000 bound 4464
            raise ValueError(f"metrics_port {self.metrics_port} is outside [0, 65535]")
        for name in ("max_concurrent_rpcs", "max_streams_per_connection", "max_connections"):
            if not 1 <= getattr(self, name) <= 1_000_000:
                raise ValueError(f"{name} {getattr(self, name)} is outside [1, 1000000]")
        if self.max_message_bytes is not None and not 64 * 1024 <= self.max_message_bytes <= 1 << 30:
            raise ValueError(f"max_message_bytes {self.max_message_bytes} is outside [65536, 1073741824]")
        for name in ("max_connection_idle_sec", "handshake_timeout_sec"):
            if not 0.1 <= getattr(self, name) <= 86_400:
                raise ValueError(f"{name} {getattr(self, name)} is outside [0.1, 86400] seconds")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file must be set together")
        if self.tls_cert_file is not None:
            if self.tls.cert_file is not None:
                raise ValueError("set tls.cert_file/key_file or the older tls_cert_file/tls_key_file, not both")
            object.__setattr__(self, "tls", replace(self.tls, cert_file=self.tls_cert_file, key_file=self.tls_key_file))
        if self.ops_tls not in ("auto", "https", "plaintext"):
            raise ValueError(f"ops_tls must be auto, https or plaintext, not {self.ops_tls!r}")
        if self.ops_tls == "https" and not self.tls.serves_tls:
            raise ValueError("ops_tls: https needs tls.cert_file and tls.key_file (the certificate to serve)")


def read_secret(path: str | None, what: str = "management key") -> str | None:
    """Read a key file (whitespace stripped); None when *path* is None. *what* names the key in
    error messages ("cannot read API key file …")."""
    if path is None:
        return None
    key = read_key_text(path, what).strip()
    if not key:
        raise ConfigError(f"{what} file {path} is empty")
    return key


_CODES = {c.name: c for c in grpc.StatusCode}


def status_details(code: grpc.StatusCode, message: str, reason: str, metadata: dict[str, str]) -> bytes:
    info = error_details_pb2.ErrorInfo(reason=reason, domain=ERROR_DOMAIN, metadata=metadata)
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=getattr(code_pb2, code.name), message=message, details=[detail])
    return status.SerializeToString()


def error_info(exc: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo | None:
    """The ``google.rpc.ErrorInfo`` of a failed call, if the server sent one."""
    for key, value in exc.trailing_metadata() or ():
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    return info
    return None


def error_reason(exc: grpc.aio.AioRpcError) -> str | None:
    """The ``ErrorInfo.reason`` of a failed call, if the server sent one."""
    info = error_info(exc)
    return info.reason if info is not None else None


async def _abort(context: grpc.aio.ServicerContext, exc: MotorError) -> None:
    code = _CODES.get(exc.code, grpc.StatusCode.INTERNAL)
    details = status_details(code, exc.message, exc.reason, exc.metadata)
    await context.abort(code, exc.message, trailing_metadata=(("grpc-status-details-bin", details),))


def _split(method: str) -> tuple[str, str]:
    service, _, name = method.lstrip("/").rpartition("/")
    return service, name


class _Interceptor(grpc.aio.ServerInterceptor):
    """Wraps each method's handler once (cached by method name); the per-call work — request id,
    management key, metrics, error translation, unknown-field check — happens inside the call."""

    def __init__(self, auth: Authenticator, roles: dict[str, tuple[Role, frozenset[str]]],
                 max_fields: dict[str, int | None]) -> None:
        self._auth = auth
        self._roles = roles
        self._max_fields = max_fields
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        wrapped = self._wrapped.get(details.method)
        if wrapped is not None:
            return wrapped
        handler = await continuation(details)
        if handler is None:
            return handler
        service, method = _split(details.method)
        role, open_methods = self._roles.get(service, (None, frozenset()))
        needs = role if role is not None and method not in open_methods and self._auth.requires(role) else None
        wrapped = _wrap(handler, service, method, self._auth if needs else None, needs,
                        self._max_fields.get(service, MAX_FIELDS))
        self._wrapped[details.method] = wrapped
        return wrapped


_ROLE_WORDS = {Role.OPERATOR: "an operator key", Role.NODE: "a node key", Role.INFERENCE: "an inference (API) key"}


def _authenticate(given: str | None, auth: Authenticator, role: Role, service: str) -> Principal:
    """The caller of a method that needs *role*: UNAUTHENTICATED without a known key,
    PERMISSION_DENIED when the key is of another kind."""
    short = service.rsplit(".", 1)[-1]
    if not given:
        if role is Role.INFERENCE:
            hint = "send metadata 'authorization: Bearer <key>'"
        else:
            hint = f"send metadata '{MANAGEMENT_KEY_HEADER}'"
        raise Unauthenticated(f"missing credential: {short} needs {_ROLE_WORDS[role]}; {hint}",
                              reason="MANAGEMENT_KEY_REQUIRED")
    principal = auth.identify(given)
    if principal is None:
        raise Unauthenticated(f"unknown credential: {short} needs {_ROLE_WORDS[role]}",
                              reason="MANAGEMENT_KEY_REQUIRED")
    if role not in principal.roles:
        kinds = " and ".join(_ROLE_WORDS[r] for r in sorted(principal.roles))
        raise PermissionDenied(
            f"key {principal.name!r} is {kinds}; {short} needs {_ROLE_WORDS[role]}",
            reason="CREDENTIAL_ROLE", metadata={"needs": role.value, "key": principal.name},
        )
    return principal


def _bearer(value: str) -> str:
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _finish(service: str, method: str, start: float, code: str) -> None:
    RPC_HANDLED.labels(service, method, code).inc()
    RPC_SECONDS.labels(service, method).observe(time.perf_counter() - start)


def _code_of(context: grpc.aio.ServicerContext) -> str:
    code = context.code()
    return code.name if isinstance(code, grpc.StatusCode) else "OK"


@dataclass(frozen=True)
class _Malformed:
    """What the deserializer gives for bytes that are not a valid message (refused in the call)."""

    why: str


@dataclass(frozen=True)
class _TooManyFields:
    """What the deserializer gives for a message with more fields than allowed (not parsed)."""

    limit: int


# Unknown fields named in a refusal (a newer client's message may carry thousands; the status goes
# in trailers, and a client drops trailers past 16 KiB with a RESOURCE_EXHAUSTED of its own).
_NAMED_UNKNOWN = 10


@dataclass(frozen=True)
class _UnknownFields:
    """What the deserializer gives for a message with fields this server does not know."""

    paths: tuple[str, ...]


def _request_type(service: str, method: str) -> Any:
    """The request message descriptor of *service*/*method*, if the default pool has it."""
    try:
        return descriptor_pool.Default().FindServiceByName(service).FindMethodByName(method).input_type
    except KeyError:
        return None


def _lenient(deserialize: Callable[[bytes], Any], request_type: Any, max_fields: int | None) -> Callable[[bytes], Any]:
    """*deserialize*, but bytes that do not parse give :class:`_Malformed` instead of raising (grpc
    would answer UNKNOWN with the Python exception's class name), a large message with more than
    *max_fields* fields (counted on the wire) gives :class:`_TooManyFields` without being parsed,
    and one with unknown fields :class:`_UnknownFields` (checked here, where the wire size is
    known: ``strict_proto``'s one-pass check for small messages)."""

    def parse(raw: bytes) -> Any:
        if (max_fields is not None and request_type is not None and len(raw) > MEASURE_ABOVE_BYTES
                and count_fields(raw, request_type, max_fields) > max_fields):
            return _TooManyFields(max_fields)
        try:
            msg = deserialize(raw)
        except Exception as exc:  # DecodeError, or RecursionError past the nesting limit
            return _Malformed(str(exc) or type(exc).__name__)
        paths = unknown_field_paths(msg, wire_size=len(raw))
        return _UnknownFields(tuple(paths)) if paths else msg

    return parse


def _check_known(request: Any) -> None:
    """Unknown fields are rejected, never silently dropped (INVALID_ARGUMENT, nothing applied)."""
    if isinstance(request, _TooManyFields):
        raise InvalidArgument(f"the request holds more than {request.limit} fields (nested messages' fields and map "
                              "entries included); send fewer items per call", reason="TOO_MANY_FIELDS")
    if isinstance(request, _Malformed):
        raise InvalidArgument(f"the request is not a valid protobuf message ({request.why}); nothing was applied",
                              reason="MALFORMED_REQUEST")
    if isinstance(request, _UnknownFields):
        paths = request.paths
        named = ", ".join(paths[:_NAMED_UNKNOWN])  # the status rides in trailers, which are bounded
        if len(paths) > _NAMED_UNKNOWN:
            named += f", ... ({len(paths)} in all)"
        raise InvalidArgument(
            f"unknown field(s) {named}: this server does not know them (is the client "
            "built from a newer or different motor proto?)",
            reason="UNKNOWN_FIELD",
            metadata={"fields": ",".join(paths[:_NAMED_UNKNOWN])},
        )
    check_request(request)


async def _checked_stream(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        _check_known(request)
        yield request


async def _first(requests: AsyncIterator[Any]) -> Any:
    """The request of a unary call served as a request stream (read after authentication)."""
    async for request in requests:
        return request
    raise InvalidArgument("the call carried no request message", reason="MISSING_REQUEST")


def _wrap(
    handler: grpc.RpcMethodHandler, service: str, method: str, auth: Authenticator | None,
    role: Role | None, max_fields: int | None = MAX_FIELDS,
) -> grpc.RpcMethodHandler:
    """*auth*/*role*: the credential this method requires (None = open); *max_fields*: the most
    fields a request may hold (None = any number, bounded by the message size).

    A method that needs a credential reads its request only once the caller is authenticated: a
    unary request is served as a request stream whose one message is read inside the call, so a
    caller without a valid key cannot make the server receive and parse a large request (64 MiB of
    nested messages takes seconds of the event loop and gigabytes to parse)."""
    audited = role is Role.OPERATOR and is_mutation(method)
    des, ser = handler.request_deserializer, handler.response_serializer
    if des is not None:
        des = _lenient(des, _request_type(service, method), max_fields)
    streaming_in = bool(handler.stream_unary or handler.stream_stream)
    read_late = auth is not None and not streaming_in

    def _checked(request: Any) -> Any:
        if streaming_in:
            return _checked_stream(request)
        _check_known(request)
        return request


    async def _fail(exc: BaseException, context: grpc.aio.ServicerContext) -> None:
        if isinstance(exc, MotorError):
            await _abort(context, exc)
        if isinstance(exc, NotImplementedError):
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{service}/{method} is not implemented yet")
        rid = request_id_var.get()
        log.exception("unhandled error in %s/%s (request id %s)", service, method, rid)
        await _abort(context, MotorError(
            f"internal error in {method}; the server log has the details under request id {rid}",
            metadata={"request_id": rid}))

    @contextlib.asynccontextmanager
    async def _scope(context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        """Request id, management key, metrics and error translation around one call."""
        request_id = given = None
        for k, v in context.invocation_metadata() or ():
            if k == REQUEST_ID_HEADER:
                request_id = v
            elif k == MANAGEMENT_KEY_HEADER:
                given = v
            elif k == AUTHORIZATION_HEADER and given is None:
                given = _bearer(v)
        if request_id is not None and not valid_request_id(request_id):
            request_id = None
        token = request_id_var.set(request_id or new_request_id())
        start = time.perf_counter()
        code = "OK"
        principal = None
        try:
            if auth is not None and role is not None:
                principal = _authenticate(given, auth, role, service)
            yield
        except MotorError as exc:
            code = exc.code
            await _fail(exc, context)
        except (grpc.aio.AbortError, grpc.RpcError):
            code = _code_of(context)
            raise
        except (asyncio.CancelledError, GeneratorExit):  # the caller went away (or the server stops)
            code = "CANCELLED"
            raise
        except Exception as exc:
            code = "UNIMPLEMENTED" if isinstance(exc, NotImplementedError) else "INTERNAL"
            await _fail(exc, context)
        finally:
            _finish(service, method, start, code)
            if audited and principal is not None:
                audit(principal, service, method, request_id_var.get(), code)
            # A cancelled stream's generator is closed by asyncio's finalizer, in another context.
            with contextlib.suppress(ValueError):
                request_id_var.reset(token)

    if handler.unary_unary or handler.stream_unary:
        inner = handler.unary_unary or handler.stream_unary

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            async with _scope(context):
                if read_late:
                    request = await _first(request)
                return await inner(_checked(request), context)

        if read_late:
            return grpc.stream_unary_rpc_method_handler(unary, des, ser)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(unary, des, ser)
        return grpc.stream_unary_rpc_method_handler(unary, des, ser)

    inner_stream = handler.unary_stream or handler.stream_stream

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async with _scope(context):
            if read_late:
                request = await _first(request)
            answers = inner_stream(_checked(request), context)
            if inspect.isawaitable(answers):  # a handler that writes with context.write (Health/Watch)
                await answers
                return
            # Closed here, not left to the garbage collector: a reference to it (from a logged
            # traceback) would keep a cancelled handler's generator, and its cleanup, from running.
            async with contextlib.aclosing(answers):
                async for item in answers:
                    yield item

    if read_late:
        return grpc.stream_stream_rpc_method_handler(streaming, des, ser)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(streaming, des, ser)
    return grpc.stream_stream_rpc_method_handler(streaming, des, ser)


class GrpcServer:
    """A grpc.aio server with health, reflection, auth, errors, request ids and metrics.

    Usage::

        server = GrpcServer("coordinator", cfg)
        server.add_service(
            "motor.coordinator.v1.InstanceRegistryService",
            lambda s: coordinator_pb2_grpc.add_InstanceRegistryServiceServicer_to_server(impl, s),
            protected=True,
        )
        port = await server.start()
        ...
        await server.stop()
    """

    def __init__(self, name: str, config: ServerConfig, *, management_key: str | None = None,
                 inference_keys_file: str | None = None, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        """*inference_keys_file*: inference keys to use when ``server.auth.inference_keys_file``
        is unset (the coordinator passes its HTTP front's ``api_key_file``). *max_message_bytes*:
        the largest request message received (a larger one is RESOURCE_EXHAUSTED before anything
        parses it); only the coordinator, whose Dispatch carries request bodies, needs more than
        the default. ``server.max_message_bytes``, when set, overrides it."""
        self.name = name
        self.config = config
        self.max_message_bytes = config.max_message_bytes or max_message_bytes
        self._key = management_key if management_key is not None else read_secret(config.management_key_file)
        self.auth = Authenticator.from_config(config.auth, self._key, inference_keys_file)
        self._services: list[tuple[str, Callable[[grpc.aio.Server], None], bool]] = []
        self._roles: dict[str, tuple[Role, frozenset[str]]] = {}
        self._max_fields: dict[str, int | None] = {}
        self._server: grpc.aio.Server | None = None
        self.health = health.aio.HealthServicer() if hasattr(health, "aio") else _health_servicer()
        self.port = 0
        # What the operator can do when the port is taken (the programs' flag).
        self.bind_hint = "pass --port or free it"

    @property
    def management_key(self) -> str | None:
        return self._key

    @functools.cached_property
    def client_key(self) -> Credential:
        """The credential this program presents when it calls others (``server.auth.key_file``,
        re-read when it changes, else the management key); made once."""
        return presented_key(self.config.auth, self._key)

    def add_service(
        self, full_name: str, register: Callable[[grpc.aio.Server], None], *, protected: bool = False,
        role: Role | None = None, open_methods: tuple[str, ...] = (), max_request_fields: int | None = MAX_FIELDS,
    ) -> None:
        """*protected*: the methods need an operator key (same as ``role=Role.OPERATOR``); *role*:
        the kind of key they need when this program has such keys configured; *open_methods*:
        methods of the service that need none; *max_request_fields*: the most fields (nested ones
        included) a request may hold, counted before it is parsed (None = no count: only the
        message size bounds it)."""
        if self._server is not None:
            raise RuntimeError("add_service after start")
        role = role or (Role.OPERATOR if protected else None)
        self._services.append((full_name, register, role is not None))
        if role is not None:
            self._roles[full_name] = (role, frozenset(open_methods))
        self._max_fields[full_name] = max_request_fields

    @property
    def service_names(self) -> list[str]:
        return [name for name, _, _ in self._services]

    async def start(self) -> int:
        for service, (role, _) in sorted(self._roles.items()):
            if not self.auth.requires(role):
                what = {Role.OPERATOR: "server.auth.operator_keys_file or server.management_key_file",
                        Role.NODE: "server.auth.node_keys_file or server.management_key_file",
                        Role.INFERENCE: "server.auth.inference_keys_file"}[role]
                log.warning("%s is open to anyone who can reach %s:%s: no %s credential is configured (set %s)",
                            service, self.config.host, self.config.port, role.value, what)
        cfg = self.config
        server = grpc.aio.server(
            interceptors=[_Interceptor(self.auth, self._roles, self._max_fields)],
            # Without these one client (no key needed: health, reflection) could hold any number
            # of calls open, ~17 KB each: 1 GB in 30 s from one connection.
            maximum_concurrent_rpcs=cfg.max_concurrent_rpcs,
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.keepalive_time_ms", 20_000),
                ("grpc.keepalive_timeout_ms", 10_000),
                ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_concurrent_streams", cfg.max_streams_per_connection),
                ("grpc.max_allowed_incoming_connections", cfg.max_connections),
                ("grpc.max_connection_idle_ms", int(cfg.max_connection_idle_sec * 1000)),
                ("grpc.server_handshake_timeout_ms", int(cfg.handshake_timeout_sec * 1000)),
            ],
        )
        for _, register, _ in self._services:
            register(server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        add_reflection(server, [*self.service_names, health.SERVICE_NAME])
        address = host_port(self.config.host, self.config.port)
        early = bind_error(self.config.host, self.config.port) if self.config.port else None
        if early is not None and early.errno == errno.EADDRINUSE:
            # Say it before gRPC's own bind logs a C-core error line and raises a bare RuntimeError.
            raise ConfigError(bind_failure(self.config.host, self.config.port, self.bind_hint))
        try:
            if self.config.tls.serves_tls:
                self.port = server.add_secure_port(address, server_credentials(self.config.tls))
            else:
                self.port = server.add_insecure_port(address)
        except RuntimeError:  # grpcio: "Failed to bind to address …"
            self.port = 0
        if self.port == 0:
            raise ConfigError(bind_failure(self.config.host, self.config.port, self.bind_hint))
        await server.start()
        self._server = server
        await self.set_serving(True)
        await _maybe_await(self.health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING))
        log.info("%s gRPC server listening", self.name, extra={"address": host_port(self.config.host, self.port)})
        return self.port

    async def set_serving(self, serving: bool, service: str | None = None) -> None:
        """Set health of one service, or of the whole server and every service when None."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        names = [service] if service is not None else ["", *self.service_names]
        for name in names:
            await _maybe_await(self.health.set(name, status))

    async def stop(self, grace: float | None = None) -> None:
        if self._server is None:
            return
        await _maybe_await(self.health.enter_graceful_shutdown())
        await self._server.stop(self.config.grace_seconds if grace is None else grace)
        self._server = None

    async def wait_for_termination(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()


def _health_servicer() -> Any:
    return health.HealthServicer(experimental_non_blocking=True)


async def _maybe_await(value: Any) -> None:
    if hasattr(value, "__await__"):
        await value

