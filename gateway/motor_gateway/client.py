"""``motor-gateway``'s :class:`~motor_common.openai_front.dispatch.DispatchClient`: the
coordinators' ``Dispatch`` RPC through the coordinator pool, with failover before the head
(``motor_gateway.failover``). gRPC failures become the OpenAI errors the front sends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from motor_common.convert import model_card_from_pb
from motor_common.credentials import Credential
from motor_common.errors import MotorError
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.grpc_client import call_metadata, translate
from motor_common.grpc_server import error_reason
from motor_common.openai_front.dispatch import (
    DispatchFailed,
    DispatchStream,
    Head,
    ModelInfo,
    Readiness,
)
from motor_common.openai_front.openai import HttpError, error_for_status, error_from_motor
from motor_common.tracing import current_carrier
from motor_gateway import failover
from motor_gateway.pool import UNREACHABLE, CoordinatorPool
from motor_gateway.routing import broken_call

__all__ = ["GrpcDispatchClient", "rpc_error"]

log = logging.getLogger(__name__)

_API = {"completions": cpb.OPEN_AI_API_COMPLETIONS, "chat": cpb.OPEN_AI_API_CHAT_COMPLETIONS,
        "embeddings": cpb.OPEN_AI_API_EMBEDDINGS, "responses": cpb.OPEN_AI_API_RESPONSES,
        "tokenize": cpb.OPEN_AI_API_TOKENIZE, "detokenize": cpb.OPEN_AI_API_DETOKENIZE,
        "version": cpb.OPEN_AI_API_VERSION, "responses_retrieve": cpb.OPEN_AI_API_RESPONSES_RETRIEVE,
        "responses_cancel": cpb.OPEN_AI_API_RESPONSES_CANCEL}


_NO_HEAD = HttpError(502, "coordinator sent no response head", "server_error", "bad_gateway")
_BAD_GATEWAY = HttpError(502, "the coordinator could not answer this request", "server_error", "bad_gateway")


def rpc_error(exc: grpc.aio.AioRpcError) -> HttpError:
    """The OpenAI error for a failed gRPC call to the coordinator. Failures of the channel itself
    (no ErrorInfo: connect errors, gRPC's own size limits) never read as the caller's fault: a
    RESOURCE_EXHAUSTED without a coordinator reason is a 502, not a 429 (SDKs retry 429s)."""
    reason = error_reason(exc)
    if reason is None:
        log.warning("coordinator call failed", extra={"grpc_code": exc.code().name, "detail": exc.details()})
        if broken_call(exc.code().name, None):  # unreachable, or gone while it held the call
            return error_for_status("UNAVAILABLE", UNREACHABLE, "COORDINATOR_UNREACHABLE")
        if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:  # gRPC's own size limits
            return _BAD_GATEWAY
    translated = translate(exc)
    code = exc.code().name if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED else translated.code
    if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        # The client's key was accepted here: the coordinator refused the gateway itself.
        log.error("a coordinator refused the gateway's credential: %s", exc.details())
        return HttpError(502, "the coordinator refused this gateway's credential; the operator must set "
                         "coordinator_key_file to one of the coordinators' inference keys",
                         "server_error", "coordinator_credential_refused")
    err = error_for_status(code, translated.message, translated.reason)
    param = translated.metadata.get("param")
    if param and err.status < 500:  # the request field the coordinator refused
        err = HttpError(err.status, err.message, err.type, err.code, param)
    return err


class _GrpcStream:
    __slots__ = ("_call", "deadline", "head")

    def __init__(self, call: Any, head: Head, deadline: float) -> None:
        self._call = call
        self.head = head
        self.deadline = deadline

    async def chunks(self) -> AsyncIterator[bytes]:
        read = self._call.read
        eof = grpc.aio.EOF
        try:
            while (frame := await read()) is not eof:
                if frame.HasField("chunk"):
                    yield frame.chunk
        except grpc.aio.AioRpcError as exc:
            raise DispatchFailed(rpc_error(exc)) from None
        except asyncio.CancelledError:
            # grpc.aio ends a call whose channel was closed under it with CancelledError although
            # this task was not cancelled: a stream still open when a rotated client certificate's
            # drained channel reached its drain time. A broken stream, not the client going away.
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise
            log.warning("the stream from the coordinator was cut: its channel was closed (drained after a "
                        "client-certificate rotation)")
            raise DispatchFailed(error_for_status("UNAVAILABLE", UNREACHABLE, "COORDINATOR_UNREACHABLE")) from None

    async def aclose(self) -> None:
        if not self._call.done():
            self._call.cancel()


class GrpcDispatchClient:
    """``DispatchService`` through the coordinator pool (failover before the head)."""

    def __init__(self, pool: CoordinatorPool, *, request_timeout: float, control_timeout: float,
                 credential: Credential = None) -> None:
        """*credential*: presented as ``authorization: Bearer`` on Dispatch and ListModels (a
        ``PresentedKey``: the key its file holds at each call)."""
        self.pool = pool
        self._credential = credential
        self.request_timeout = request_timeout
        self.control_timeout = control_timeout

    @property
    def _auth(self) -> tuple[tuple[str, str], ...]:
        credential = self._credential
        return (("authorization", f"Bearer {credential}"),) if credential else ()

    async def dispatch(self, request_id: str, api: str, raw: bytes, body: dict[str, Any]) -> DispatchStream:
        call = None
        deadline = asyncio.get_running_loop().time() + self.request_timeout
        try:
            # To the routed coordinator; resent to the new master while nothing reached the client.
            call, first = await failover.dispatch(
                self.pool, cpb.DispatchRequest(request_id=request_id, api=_API[api], body=raw),
                timeout=self.request_timeout,
                metadata=call_metadata(request_id=request_id) + self._auth + current_carrier(),
            )
            if first is grpc.aio.EOF or not first.HasField("head"):
                raise DispatchFailed(_NO_HEAD)
            head = first.head
            return _GrpcStream(call, Head(head.http_status or 200, head.content_type), deadline)
        except BaseException as exc:
            if call is not None and not call.done():
                call.cancel()
            if isinstance(exc, grpc.aio.AioRpcError):
                raise DispatchFailed(rpc_error(exc)) from None
            if isinstance(exc, MotorError):  # no coordinator could take the request
                raise DispatchFailed(error_from_motor(exc)) from None
            raise

    async def models(self, request_id: str) -> list[ModelInfo]:
        try:
            resp = await self.pool.stub().ListModels(
                cpb.ListModelsRequest(), timeout=self.control_timeout,
                metadata=call_metadata(request_id=request_id) + self._auth,
            )
        except grpc.aio.AioRpcError as exc:
            raise DispatchFailed(rpc_error(exc)) from None
        return [ModelInfo(m.id, m.created, model_card_from_pb(m)) for m in resp.models]

    async def readiness(self) -> Readiness:
        return await self.pool.readiness()
