"""The OpenAI HTTP application: routes relayed to a coordinator through a ``DispatchClient``.

It holds no scheduling logic. A request is validated lightly and dispatched (``motor-gateway``: one
gRPC ``Dispatch`` call with a deadline and the request id as ``x-request-id`` metadata; the
co-located front of ``motor-coordinator``: the dispatcher in process), and the response relayed:
the head gives status and content type, the body chunks are written as they arrive (SSE) or joined
(JSON; at most ``limits.MAX_ANSWER_BYTES``, past it the request is stopped and answered 502).
Failures become OpenAI error objects; a failure after an SSE stream started is written as a final
``data: {"error": ...}`` event. A client that goes away stops the request, which makes the
coordinator abort the engine requests. A client that stops reading a streamed answer has its
connection closed once the request's deadline has passed (plus :data:`STALL_GRACE_SEC`), which
stops the request the same way and frees its admission slot.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage
from aiohttp.web_protocol import RequestPayloadError
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from motor_common.credentials import KeyFile
from motor_common.errors import ConfigError, MotorError
from motor_common.logs import new_request_id, request_id_var
from motor_common.model_card import card_json
from motor_common.openai_front import metrics
from motor_common.openai_front.access_log import Access, log_access
from motor_common.openai_front.admission import Admission, AdmissionConfig, BodyBudget, Hold, Shed
from motor_common.openai_front.dispatch import (
    DispatchClient,
    DispatchFailed,
    DispatchStream,
    ModelInfo,
)
from motor_common.openai_front.limits import (
    ENCODINGS,
    MAX_ANSWER_BYTES,
    BodyTooLarge,
    HttpLimits,
    clean_request_id,
    decompress,
    encodings,
)
from motor_common.openai_front.openai import (
    PASSTHROUGH_ROUTES,
    RETRY_AFTER_SEC,
    HttpError,
    engine_error_body,
    error_from_motor,
    public,
    stored_response_body,
    validate_body,
)
from motor_common.openai_front.site import PROTOCOL_LOG, SERVER_HEADER, GuardedSite
from motor_common.ports import bind_failure
from motor_common.tracing import TRACEPARENT, carrier_from, incoming, tracer

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"
_JSON = "application/json"
_SSE = "text/event-stream"
# GET /v1/responses/{id} (vLLM's retrieve) and POST /v1/responses/{id}/cancel, as metric labels
_STORED = "/v1/responses/{response_id}"
_STORED_CANCEL = "/v1/responses/{response_id}/cancel"
_ROUTES = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/ready", "/metrics",
           "/version", *PASSTHROUGH_ROUTES, _STORED, _STORED_CANCEL}
# Routes outside /v1 answered by an engine: they need the API key like /v1/* (vLLM leaves them open).
_ENGINE_ROUTES = {"/version", "/tokenize", "/detokenize"}
# Routes that get a request span (tracing on) and pass an incoming traceparent on (tracing off).
_TRACED = {"/v1/completions", "/v1/chat/completions", "/version", *PASSTHROUGH_ROUTES, _STORED, _STORED_CANCEL}

# Seconds past a request's deadline that a streamed answer may still be written (its final timeout
# event included) before the connection of a client that does not read is closed.
STALL_GRACE_SEC = 2.0

# Seconds aiohttp keeps reading (and discarding) the rest of a refused body so that the client
# sees the answer before the connection closes.
_LINGER_SEC = 2.0

REQUEST_ID_KEY = web.RequestKey("request_id", str)
# The name of the inference API key a /v1 request was authenticated with (admission bucket).
API_KEY_ID = web.RequestKey("api_key_id", str)
# What the handlers learned about the request, for its access-log line.
ACCESS_KEY = web.RequestKey("access", Access)
ANONYMOUS = "anonymous"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Labelled metric children, resolved once per (route[, status]) instead of per request.
_IN_FLIGHT = {r: metrics.IN_FLIGHT.labels(r) for r in (*_ROUTES, "other")}
_LATENCY = {r: metrics.LATENCY.labels(r) for r in (*_ROUTES, "other")}
_REQUESTS: dict[tuple[str, int], Any] = {}


def _count(route: str, status: int) -> None:
    child = _REQUESTS.get((route, status))
    if child is None:
        child = _REQUESTS[(route, status)] = metrics.REQUESTS.labels(route, str(status))
    child.inc()


def error_response(err: HttpError, request_id: str | None = None) -> web.Response:
    """*err* as an OpenAI error response; a 5xx message is made public (``openai.public``) and
    the original logged with the request id."""
    headers = {"Content-Type": _JSON}
    if request_id:
        headers[REQUEST_ID_HEADER] = request_id
        shown = public(err, request_id)
        if shown is not err:
            log.warning("request failed", extra={"status": err.status, "code": err.code, "detail": err.message})
            err = shown
    if err.status == 503:  # temporary by definition: tell clients when to try again
        headers["Retry-After"] = str(RETRY_AFTER_SEC)
    return web.Response(status=err.status, body=err.json(), headers=headers)


def _shed(exc: Shed, rid: str, retry_after: int, *, close: bool = False) -> web.Response:
    resp = error_response(HttpError(429, exc.message, "rate_limit_error", exc.reason), rid)
    resp.headers["Retry-After"] = str(retry_after)
    if close:
        resp.force_close()
    return resp


def _refuse(status: int, message: str, code: str, rid: str, *, close: bool = False,
            param: str | None = None) -> web.Response:
    resp = error_response(HttpError(status, message, "invalid_request_error", code, param), rid)
    if close:
        resp.force_close()
    return resp


def read_api_key(path: str | None) -> KeyFile | None:
    """The inference keys of *path* (one bare key, or ``name: key`` lines; re-read on change)."""
    return KeyFile(path, "API key") if path else None


class Gateway:
    """Routes and handlers; the coordinator is reached through a :class:`DispatchClient` (gRPC
    pool with failover in ``motor-gateway``, in process in the co-located front)."""

    def __init__(self, client: DispatchClient, *, api_key: str | KeyFile | None = None,
                 limits: HttpLimits | None = None, admission: AdmissionConfig | None = None,
                 metrics_registry: CollectorRegistry | None = None) -> None:
        """*api_key*: one key, or named keys (a :class:`KeyFile`, re-read when it changes);
        when set, /v1/* needs ``Authorization: Bearer <key>``. *metrics_registry*: what
        ``/metrics`` serves (default: this process's; a gateway worker serves all workers')."""
        metrics.register()
        self.metrics_registry = metrics_registry or REGISTRY
        self.client = client
        self._api_key = api_key.encode() if isinstance(api_key, str) and api_key else None
        self._api_keys = api_key if isinstance(api_key, KeyFile) else None
        self.limits = limits or HttpLimits()
        self.admission = Admission(admission or AdmissionConfig())
        self.bodies = BodyBudget(self.admission.cfg.max_buffered_bytes)

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=self.limits.max_body_bytes)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model_id:.+}", self._model)
        for path, api in PASSTHROUGH_ROUTES.items():
            app.router.add_post(path, self._passthrough(api))
        app.router.add_get("/version", self._version)
        app.router.add_get(_STORED, self._stored_response("responses_retrieve"))
        app.router.add_post(_STORED_CANCEL, self._stored_response("responses_cancel"))
        app.router.add_delete(_STORED, self._delete_response)
        app.router.add_get("/health", self._health)
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/metrics", self._metrics)
        app.on_response_prepare.append(_server_header)
        return app

    # -- cross-cutting: metrics, auth, request id, errors for unknown routes ------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.path if request.path in _ROUTES else _route_of(request)
        given = request.headers.get(REQUEST_ID_HEADER)
        rid = clean_request_id(given, self.limits.max_request_id_chars) or new_request_id()
        request[REQUEST_ID_KEY] = rid
        access = request[ACCESS_KEY] = Access()
        token = request_id_var.set(rid)
        start = time.perf_counter()
        status = 500
        in_flight = _IN_FLIGHT[route]
        in_flight.inc()
        span = None
        if route in _TRACED and (TRACEPARENT in request.headers or tracer().enabled):
            span = tracer().start(f"{request.method} {route}", carrier_from(request.headers), kind="server",
                                  attrs={"http.request.method": request.method, "http.route": route,
                                         "motor.request_id": rid})
            trace_token = incoming.set(span)
        if given is not None and given != rid:
            log.info("X-Request-Id replaced: empty, longer than %d characters, or not visible ASCII",
                     self.limits.max_request_id_chars, extra={"request_id": rid})
        try:
            key = self._api_key_identity(request) if request.path.startswith("/v1/") or request.path in \
                _ENGINE_ROUTES else ANONYMOUS
            if key is None:
                resp: web.StreamResponse = error_response(
                    HttpError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                              "authentication_error", "invalid_api_key"), rid)
            else:
                request[API_KEY_ID] = key
                try:
                    resp = await handler(request)
                except web.HTTPException as exc:
                    msg = f"{request.method} {request.path}: {exc.reason}"
                    resp = error_response(HttpError(exc.status, msg, "invalid_request_error",
                                                    exc.reason.lower().replace(" ", "_")), rid)
            status = resp.status
            if not resp.prepared:
                resp.headers[REQUEST_ID_HEADER] = rid
            return resp
        except asyncio.CancelledError:
            status = 499
            raise
        finally:
            in_flight.dec()
            _count(route, status)
            elapsed = time.perf_counter() - start
            _LATENCY[route].observe(elapsed)
            log_access(request.method, route, status, elapsed, access)
            if span is not None:
                span.set("http.response.status_code", status)
                if access.model:
                    span.set("gen_ai.request.model", access.model)
                if status >= 500:
                    span.fail(f"HTTP {status}")
                span.end()
                incoming.reset(trace_token)
            request_id_var.reset(token)

    def _api_key_identity(self, request: web.Request) -> str | None:
        """The name of the inference key the request carries (its admission bucket), ANONYMOUS
        when the front needs no key, None when the key is missing or wrong."""
        if self._api_key is None and self._api_keys is None:
            return ANONYMOUS
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        token = given.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        if self._api_keys is not None:  # named keys, re-read when the file changes
            return self._api_keys.lookup(token)
        assert self._api_key is not None
        return "default" if hmac.compare_digest(token.encode(), self._api_key) else None

    # -- OpenAI routes -----------------------------------------------------------------------------

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._dispatch(request, "completions")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._dispatch(request, "chat")

    def _passthrough(self, api: str) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            return await self._dispatch(request, api)
        return handle

    async def _version(self, request: web.Request) -> web.StreamResponse:
        """GET /version: an engine's own answer (vLLM: ``{"version": ...}``), from any instance."""
        return await self._forward(request, request[REQUEST_ID_KEY], "version", b"", {})

    def _stored_response(self, api: str) -> Handler:
        """GET /v1/responses/{id} (``stream``, ``starting_after`` query) and POST .../cancel: sent
        to the engine that stored the response (the coordinator's ``response_homes.py``)."""
        async def handle(request: web.Request) -> web.StreamResponse:
            rid = request[REQUEST_ID_KEY]
            try:
                body = stored_response_body(api, request.match_info["response_id"], request.query)
            except MotorError as exc:
                return error_response(error_from_motor(exc), rid)
            request[ACCESS_KEY].stream = body.get("stream") is True
            return await self._forward(request, rid, api, orjson.dumps(body), body)
        return handle

    async def _delete_response(self, request: web.Request) -> web.StreamResponse:
        """DELETE /v1/responses/{id}: vLLM 0.32 serves no such route (its store keeps a response
        until the engine restarts), so neither does Motor: 405, in OpenAI's error shape."""
        resp = error_response(HttpError(
            405, "DELETE /v1/responses/{response_id} is not served: the engines (vLLM) cannot delete a stored "
            "response; GET retrieves it and POST /v1/responses/{response_id}/cancel stops a background one",
            "invalid_request_error", "method_not_allowed"), request[REQUEST_ID_KEY])
        resp.headers["Allow"] = "GET"
        return resp

    async def _read_body(self, request: web.Request, rid: str, hold: Hold) -> bytes | web.Response:
        """The request body, decoded, or the refusal: 415 for a Content-Encoding other than one
        of ``limits.ENCODINGS``, 413 above ``max_body_bytes`` (on Content-Length before reading,
        else while reading, and after decompression), 400 for a body that does not decompress,
        408 when it does not arrive within ``body_timeout_sec``, 429 when the process holds
        ``admission.max_buffered_bytes`` of bodies already (taken from *hold* as the bytes arrive)."""
        limit = self.limits.max_body_bytes
        codings = [c for c in encodings(request.headers.get("Content-Encoding", "")) if c != "identity"]
        unknown = [c for c in codings if c not in ENCODINGS]
        if unknown or len(codings) > 1:
            shown = unknown[0] if unknown else ", ".join(codings)
            return _refuse(415, f"Content-Encoding {shown!r} is not supported: send the body uncompressed, "
                           "or compressed once with gzip or deflate", "unsupported_content_encoding", rid, close=True)
        size = request.content_length
        if size is not None and size > limit:
            return _refuse(413, f"request body is {size} bytes; at most {limit} are accepted",
                           "request_too_large", rid, close=True)
        try:
            # Charged as it arrives, not on the Content-Length: connections that declare large
            # bodies and send nothing must not take the budget from everybody else.
            async with asyncio.timeout(self.limits.body_timeout_sec):
                raw = await _read_at_most(request, limit, hold)
        except BodyTooLarge:
            return _refuse(413, f"request body is larger than {limit} bytes", "request_too_large", rid, close=True)
        except TimeoutError:
            return _refuse(408, f"request body not received within {self.limits.body_timeout_sec:g}s",
                           "request_timeout", rid, close=True)
        except (BadHttpMessage, RequestPayloadError) as exc:
            log.info("unreadable request body", extra={"detail": str(exc)})
            return _refuse(400, "request body could not be read: it does not match its Transfer-Encoding",
                           "invalid_body", rid, close=True)
        except Shed as exc:
            return _shed(exc, rid, self.admission.cfg.retry_after_sec, close=True)
        if not codings:
            return raw
        try:
            out = decompress(raw, codings[0], limit)
            hold.take(len(out) - len(raw))
            return out
        except Shed as exc:
            return _shed(exc, rid, self.admission.cfg.retry_after_sec)
        except BodyTooLarge:
            return _refuse(413, f"request body is larger than {limit} bytes after decompression",
                           "request_too_large", rid)
        except ValueError:
            return _refuse(400, f"request body is not valid {codings[0]} data (Content-Encoding)", "invalid_body", rid)

    async def _dispatch(self, request: web.Request, api: str) -> web.StreamResponse:
        hold = Hold(self.bodies)
        try:
            return await self._admit(request, api, hold)
        finally:
            hold.free()

    async def _admit(self, request: web.Request, api: str, hold: Hold) -> web.StreamResponse:
        rid: str = request[REQUEST_ID_KEY]
        raw = await self._read_body(request, rid, hold)
        if isinstance(raw, web.Response):
            return raw
        try:
            body = validate_body(raw, api, self.limits)
        except MotorError as exc:
            return error_response(error_from_motor(exc), rid)
        access = request[ACCESS_KEY]
        model = body.get("model") or ""  # a pass-through request may leave it to the coordinator
        access.model = model
        access.stream = body.get("stream") is True
        try:
            ticket = await self.admission.acquire(model, request[API_KEY_ID], len(raw))
        except Shed as exc:
            return _shed(exc, rid, self.admission.cfg.retry_after_sec)
        try:
            return await self._forward(request, rid, api, raw, body)
        finally:
            self.admission.release(ticket)

    async def _forward(self, request: web.Request, rid: str, api: str, raw: bytes,
                       body: dict[str, Any]) -> web.StreamResponse:
        try:
            call = await self.client.dispatch(rid, api, raw, body)
        except DispatchFailed as exc:
            return error_response(exc.error, rid)
        stream: web.StreamResponse | None = None
        guard: asyncio.TimerHandle | None = None
        try:
            head = call.head
            ctype = head.content_type or _JSON
            headers = {"Content-Type": ctype, REQUEST_ID_HEADER: rid}
            if not ctype.startswith(_SSE):
                data = await _collected(call, MAX_ANSWER_BYTES)
                if head.status >= 400:
                    data = self._engine_error(head.status, data, rid, headers)
                else:
                    request[ACCESS_KEY].usage_from_json(data)
                return web.Response(status=head.status, body=data, headers=headers)
            stream = web.StreamResponse(status=head.status, headers=headers)
            stream.headers["Cache-Control"] = "no-cache"
            await stream.prepare(request)
            # A client that stops reading blocks the writes below once the socket buffers are full;
            # past the deadline its connection is closed, which ends this handler.
            guard = asyncio.get_running_loop().call_at(call.deadline + STALL_GRACE_SEC, _cut_off, request)
            access = request[ACCESS_KEY]
            async for chunk in call.chunks():
                access.usage_from_sse(chunk)
                await stream.write(chunk)
            await stream.write_eof()
            return stream
        except DispatchFailed as exc:
            if stream is None:
                return error_response(exc.error, rid)
            try:
                await stream.write(public(exc.error, rid).sse_event())
                await stream.write_eof()
            except ConnectionResetError:
                pass
            return stream
        except AnswerTooLarge as exc:  # the finally clause stops the request
            log.warning("non-streamed answer larger than %d bytes: request stopped", exc.limit)
            return error_response(HttpError(
                502, f"the answer is larger than {exc.limit} bytes, the most this server sends unstreamed; "
                "ask for a streamed answer (\"stream\": true) or a smaller one", "server_error",
                "response_too_large"), rid)
        except ConnectionResetError:
            # The client went away mid-stream; the finally clause stops the request.
            return stream if stream is not None else web.Response(status=499)
        finally:
            if guard is not None:
                guard.cancel()
            await call.aclose()

    @staticmethod
    def _engine_error(status: int, data: bytes, rid: str, headers: dict[str, str]) -> bytes:
        """An engine's error answer in the one OpenAI error shape (``openai.engine_error_body``)."""
        replaced = engine_error_body(status, data, rid)
        if replaced is None:
            return data
        if status >= 500:
            log.warning("engine error answer", extra={"status": status, "detail": data[:2000].decode("utf-8", "replace")})
        headers["Content-Type"] = _JSON
        return replaced

    async def _models(self, request: web.Request) -> web.Response:
        try:
            models = await self.client.models(request[REQUEST_ID_KEY])
        except DispatchFailed as exc:
            return error_response(exc.error, request[REQUEST_ID_KEY])
        data: list[dict[str, Any]] = [_model_card(m) for m in models]
        return web.Response(body=orjson.dumps({"object": "list", "data": data}),
                            headers={"Content-Type": _JSON})

    async def _model(self, request: web.Request) -> web.Response:
        """GET /v1/models/{id}: one model card, or 404 model_not_found (OpenAI's retrieve)."""
        wanted = request.match_info["model_id"]
        try:
            models = await self.client.models(request[REQUEST_ID_KEY])
        except DispatchFailed as exc:
            return error_response(exc.error, request[REQUEST_ID_KEY])
        for m in models:
            if m.id == wanted:
                return web.Response(body=orjson.dumps(_model_card(m)), headers={"Content-Type": _JSON})
        return error_response(HttpError(404, f"model {wanted[:200]!r} is not served by any registered instance",
                                         "not_found_error", "model_not_found", "model"), request[REQUEST_ID_KEY])

    # -- ops -------------------------------------------------------------------------------------

    async def _health(self, _: web.Request) -> web.Response:
        """Liveness: the process answers. Never asks the coordinator, so a gateway whose
        coordinators are down is not restarted (its ``/ready`` says why it cannot serve)."""
        return web.Response(body=b'{"status":"ok"}', headers={"Content-Type": _JSON})

    async def _ready(self, _: web.Request) -> web.Response:
        """Readiness: 503 with the reason when no coordinator can schedule a request."""
        state = await self.client.readiness()
        if state.ready:
            body: dict[str, Any] = {"status": "ok"}
        else:
            body = {"status": "unavailable", "reason": state.reason}
        return web.Response(status=200 if state.ready else 503, body=orjson.dumps(body),
                            headers={"Content-Type": _JSON})

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics_registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


def _route_of(request: web.Request) -> str:
    """The metric label of a route with a path parameter, else ``other``."""
    path = request.path
    if path.startswith("/v1/responses/"):
        return _STORED_CANCEL if path.endswith("/cancel") else _STORED
    return "other"


class AnswerTooLarge(Exception):
    """A non-streamed answer passed the bytes the front collects (``limits.MAX_ANSWER_BYTES``)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"answer larger than {limit} bytes")
        self.limit = limit


async def _collected(call: DispatchStream, limit: int) -> bytes:
    """The whole non-streamed answer of *call*; :class:`AnswerTooLarge` as soon as it passes
    *limit* bytes (what is collected stays within it; the caller stops the request)."""
    chunks: list[bytes] = []
    size = 0
    async for c in call.chunks():
        size += len(c)
        if size > limit:
            raise AnswerTooLarge(limit)
        chunks.append(c)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _cut_off(request: web.Request) -> None:
    """The request's deadline passed while its streamed answer was still being written: the client
    stopped reading (its socket buffers are full). Close the connection: aiohttp cancels the
    handler, which stops the request upstream and frees its admission slot."""
    transport = request.transport
    if transport is not None and not transport.is_closing():
        log.warning("the client did not read the streamed answer before the request's deadline: "
                    "connection closed")
        transport.abort()


async def _read_at_most(request: web.Request, limit: int, hold: Hold) -> bytes:
    """The body in the chunks the connection delivers (aiohttp's ``read()`` first enlarges its
    buffer to the whole limit); ``BodyTooLarge`` as soon as it passes *limit*. Each chunk is taken
    from the body budget (*hold*) as it arrives (``Shed``)."""
    buf = bytearray()
    content = request.content
    while chunk := await content.readany():
        buf += chunk
        if len(buf) > limit:
            raise BodyTooLarge(limit)
        hold.take(len(chunk))
    return bytes(buf)


async def start_site(app: web.Application, host: str, port: int, *, shutdown_timeout: float,
                     reuse_port: bool = False, limits: HttpLimits | None = None,
                     ssl_context: ssl.SSLContext | None = None,
                     bind_hint: str = "pass --port or free it") -> tuple[web.AppRunner, int]:
    """Serve *app* on host:port (0 = any) within *limits* (connections, header timeout), HTTPS
    with *ssl_context*; returns the runner (``await runner.cleanup()``) and the bound port. Raises
    ``ConfigError`` when the address cannot be bound (*bind_hint*: what the operator can do about
    a busy port)."""
    limits = limits or HttpLimits()
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=shutdown_timeout,
                           keepalive_timeout=limits.header_timeout_sec, lingering_time=_LINGER_SEC,
                           auto_decompress=False, logger=PROTOCOL_LOG)
    await runner.setup()
    try:
        site = GuardedSite(runner, host, port, max_connections=limits.max_connections,
                           reuse_port=reuse_port, ssl_context=ssl_context,
                           handshake_timeout=limits.header_timeout_sec)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(bind_failure(host, port, bind_hint, exc.strerror or "")) from exc
    except BaseException:
        await runner.cleanup()
        raise
    return runner, site.port


async def _server_header(_request: web.Request, response: web.StreamResponse) -> None:
    """``Server: motor-gateway``, not aiohttp's default (which names the Python and aiohttp versions)."""
    response.headers["Server"] = SERVER_HEADER


def _model_card(m: ModelInfo) -> dict[str, Any]:
    """An OpenAI model object; with the engines' card, vLLM's root, parent, max_model_len, permission."""
    card: dict[str, Any] = {"id": m.id, "object": "model", "created": m.created, "owned_by": "motor"}
    if m.card is not None:
        card.update(card_json(m.card))
    return card
