"""The gateway's HTTP application: OpenAI routes relayed to the coordinator's DispatchService.

The gateway holds no scheduling logic. A request is validated lightly, sent as one ``Dispatch``
call (a deadline, the request id as ``x-request-id`` metadata), and the response relayed: the first
frame (``head``) gives status and content type, the following ``chunk`` frames are written as they
arrive (SSE) or joined (JSON). Failures become OpenAI error objects; a failure after an SSE stream
started is written as a final ``data: {"error": ...}`` event. A client that goes away cancels the
gRPC call, which makes the coordinator abort the engine requests.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from motor_common.errors import MotorError
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.grpc_client import call_metadata, translate
from motor_common.grpc_server import error_reason
from motor_common.logs import new_request_id, request_id_var
from motor_gateway import failover, metrics
from motor_gateway.openai import HttpError, error_for_status, error_from_motor, validate_body
from motor_gateway.pool import UNREACHABLE, CoordinatorPool

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"
_JSON = "application/json"
_SSE = "text/event-stream"
_API = {"completions": cpb.OPEN_AI_API_COMPLETIONS, "chat": cpb.OPEN_AI_API_CHAT_COMPLETIONS}
_ROUTES = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"}

REQUEST_ID_KEY = web.RequestKey("request_id", str)

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
    headers = {"Content-Type": _JSON}
    if request_id:
        headers[REQUEST_ID_HEADER] = request_id
    return web.Response(status=err.status, body=err.json(), headers=headers)


def _rpc_error(exc: grpc.aio.AioRpcError) -> HttpError:
    translated = translate(exc)
    code = exc.code().name if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED else translated.code
    if exc.code() == grpc.StatusCode.UNAVAILABLE and error_reason(exc) is None:
        # No ErrorInfo: the channel failed, not the coordinator's scheduling.
        return error_for_status("UNAVAILABLE", f"{UNREACHABLE}: {exc.details()}", "COORDINATOR_UNREACHABLE")
    return error_for_status(code, translated.message, translated.reason)


class Gateway:
    """Routes and handlers; owns nothing but a reference to the coordinator pool."""

    def __init__(
        self, pool: CoordinatorPool, *, request_timeout: float, control_timeout: float,
        api_key: str | None = None,
    ) -> None:
        self.pool = pool
        self.request_timeout = request_timeout
        self.control_timeout = control_timeout
        self._api_key = api_key.encode() if api_key else None

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        return app

    # -- cross-cutting: metrics, auth, request id, errors for unknown routes ------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.path if request.path in _ROUTES else "other"
        rid = request.headers.get(REQUEST_ID_HEADER) or new_request_id()
        request[REQUEST_ID_KEY] = rid
        token = request_id_var.set(rid)
        start = time.perf_counter()
        status = 500
        in_flight = _IN_FLIGHT[route]
        in_flight.inc()
        try:
            if request.path.startswith("/v1/") and not self._authorized(request):
                resp: web.StreamResponse = error_response(
                    HttpError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                              "authentication_error", "invalid_api_key"), rid)
            else:
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
            _LATENCY[route].observe(time.perf_counter() - start)
            request_id_var.reset(token)

    def _authorized(self, request: web.Request) -> bool:
        if self._api_key is None:
            return True
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._api_key)

    # -- OpenAI routes -----------------------------------------------------------------------------

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._dispatch(request, "completions")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._dispatch(request, "chat")

    async def _dispatch(self, request: web.Request, api: str) -> web.StreamResponse:
        rid: str = request[REQUEST_ID_KEY]
        raw = await request.read()
        try:
            validate_body(raw, api)
        except MotorError as exc:
            return error_response(error_from_motor(exc), rid)
        stream: web.StreamResponse | None = None
        call = None
        try:
            # To the routed coordinator; resent to the new master while nothing reached the client.
            call, first = await failover.dispatch(
                self.pool, cpb.DispatchRequest(request_id=rid, api=_API[api], body=raw),
                timeout=self.request_timeout, metadata=call_metadata(request_id=rid),
            )
            if first is grpc.aio.EOF or first.WhichOneof("frame") != "head":
                return error_response(
                    HttpError(502, "coordinator sent no response head", "server_error", "bad_gateway"), rid)
            head = first.head
            ctype = head.content_type or _JSON
            headers = {"Content-Type": ctype, REQUEST_ID_HEADER: rid}
            if not ctype.startswith(_SSE):
                chunks = []
                while (frame := await call.read()) is not grpc.aio.EOF:
                    if frame.WhichOneof("frame") == "chunk":
                        chunks.append(frame.chunk)
                return web.Response(status=head.http_status or 200, body=b"".join(chunks), headers=headers)
            stream = web.StreamResponse(status=head.http_status or 200, headers=headers)
            stream.headers["Cache-Control"] = "no-cache"
            await stream.prepare(request)
            while (frame := await call.read()) is not grpc.aio.EOF:
                if frame.WhichOneof("frame") == "chunk":
                    await stream.write(frame.chunk)
            await stream.write_eof()
            return stream
        except grpc.aio.AioRpcError as exc:
            err = _rpc_error(exc)
            if stream is None:
                return error_response(err, rid)
            try:
                await stream.write(err.sse_event())
                await stream.write_eof()
            except ConnectionResetError:
                pass
            return stream
        except ConnectionResetError:
            # The client went away mid-stream; the finally clause cancels the call.
            return stream if stream is not None else web.Response(status=499)
        except MotorError as exc:  # no coordinator could take the request
            return error_response(error_from_motor(exc), rid)
        finally:
            if call is not None and not call.done():
                call.cancel()

    async def _models(self, request: web.Request) -> web.Response:
        try:
            resp = await self.pool.stub().ListModels(
                cpb.ListModelsRequest(), timeout=self.control_timeout,
                metadata=call_metadata(request_id=request[REQUEST_ID_KEY]),
            )
        except grpc.aio.AioRpcError as exc:
            return error_response(_rpc_error(exc), request[REQUEST_ID_KEY])
        data: list[dict[str, Any]] = [
            {"id": m.id, "object": "model", "created": m.created, "owned_by": "motor"}
            for m in resp.models
        ]
        return web.Response(body=orjson.dumps({"object": "list", "data": data}),
                            headers={"Content-Type": _JSON})

    # -- ops -------------------------------------------------------------------------------------

    async def _health(self, _: web.Request) -> web.Response:
        state = await self.pool.readiness()
        if state.ready:
            body: dict[str, Any] = {"status": "ok"}
        else:
            body = {"status": "unavailable", "reason": state.reason}
        return web.Response(status=200 if state.ready else 503, body=orjson.dumps(body),
                            headers={"Content-Type": _JSON})

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})
