"""The co-located OpenAI front: the shared OpenAI HTTP application (``motor_common.openai_front``,
the one ``motor-gateway`` serves) in the coordinator process itself, dispatching in process (no
gRPC hop, no second process).

The routes, validation, error objects, SSE relay, request ids and client-disconnect handling are
the shared front's (``motor_common.openai_front.app.Gateway``); only its :class:`DispatchClient` differs:
:class:`InProcessDispatchClient` runs the dispatcher's frames directly. Errors map exactly as they
would after a gRPC round trip (``MotorError`` code/message/reason → OpenAI error; anything else is
an internal error). The separate ``motor-gateway`` remains the scale-out / HA-failover front.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry

from motor_common.credentials import KeyFile
from motor_common.errors import DeadlineExceeded, MotorError
from motor_common.logs import request_id_var
from motor_common.openai_front.admission import AdmissionConfig
from motor_common.openai_front.app import Gateway, start_site
from motor_common.openai_front.dispatch import (
    DispatchFailed,
    DispatchStream,
    Head,
    ModelInfo,
    Readiness,
)
from motor_common.openai_front.limits import HttpLimits
from motor_common.openai_front.openai import HttpError, error_from_motor
from motor_common.tracing import incoming
from motor_coordinator.dispatch_service import Admitting, admit
from motor_coordinator.dispatcher import Frame
from motor_coordinator.dispatcher import Head as CoordinatorHead
from motor_coordinator.request import parsed_request
from motor_coordinator.request_metrics import observed

if TYPE_CHECKING:
    from motor_coordinator.dispatcher import Dispatcher
    from motor_coordinator.monitor import Monitor
    from motor_coordinator.readiness import Readiness as CoordinatorReadiness
    from motor_coordinator.scheduler import Scheduler


class FrontApp(Admitting, Protocol):
    """What the co-located front needs of its process: a coordinator, or one of its front workers."""

    @property
    def address(self) -> str: ...

    @property
    def dispatcher(self) -> Dispatcher: ...

    @property
    def monitor(self) -> Monitor: ...

    @property
    def scheduler(self) -> Scheduler: ...

    def model_created(self, model: str) -> int: ...

    def readiness(self) -> CoordinatorReadiness: ...

log = logging.getLogger(__name__)

_NO_HEAD = HttpError(502, "coordinator sent no response head", "server_error", "bad_gateway")


class DispatchBackend(Protocol):
    """What the in-process client needs from a coordinator (tests script it)."""

    def frames(self, api: str, body: dict[str, Any], request_id: str) -> AsyncIterator[Frame]:
        """The dispatcher's frames (a head, then body chunks); raises ``MotorError``."""
        ...

    def models(self) -> list[ModelInfo]:
        ...

    def readiness(self) -> Readiness:
        ...


class CoordinatorBackend:
    def __init__(self, app: FrontApp) -> None:
        self.app = app

    def frames(self, api: str, body: dict[str, Any], request_id: str) -> AsyncIterator[Frame]:
        admit(self.app, degraded_hint=False)
        parsed = parsed_request(api, body)
        # The front's request span (or the trace headers it received), set by its middleware.
        return observed(self.app.dispatcher.dispatch(parsed, request_id, trace=incoming.get()), parsed.model)

    def models(self) -> list[ModelInfo]:
        cards = self.app.monitor.cards
        return [ModelInfo(name, self.app.model_created(name), cards.get(name))
                for name in sorted(self.app.scheduler.models())]

    def readiness(self) -> Readiness:
        r = self.app.readiness()
        return Readiness(r.ready, "ok" if r.ready else (r.reason or "not ready"), self.app.address)


def _error(exc: BaseException) -> HttpError:
    """The OpenAI error the gateway would give for *exc* raised in the coordinator's Dispatch."""
    if not isinstance(exc, MotorError):
        rid = request_id_var.get()
        log.error("unhandled error in the in-process dispatch (request id %s)", rid, exc_info=exc)
        exc = MotorError(f"internal error; the server log has the details under request id {rid}")
    return error_from_motor(exc)


class _LocalStream:
    """The dispatcher's frames for the HTTP handler, under the request's deadline: one timer per
    request (not an ``asyncio.timeout`` per frame), which cancels the handler's task only while it
    waits for the next frame; a deadline that passed meanwhile fails the next wait at once. A
    handler blocked writing to a client that does not read is ended by the front itself
    (``app.STALL_GRACE_SEC`` after :attr:`deadline`), which closes the frames (:meth:`aclose`)."""

    __slots__ = ("_fired", "_frames", "_rid", "_task", "_timeout", "_timer", "_waiting", "deadline", "head")

    def __init__(self, frames: AsyncIterator[Frame], deadline: float, timeout: float, rid: str) -> None:
        self._frames = frames
        self.deadline = deadline
        self._timeout = timeout
        self._rid = rid
        self._task = asyncio.current_task()
        self._waiting = False
        self._fired = False
        self._timer = asyncio.get_running_loop().call_at(deadline, self._on_deadline)
        self.head = Head(200, "")

    def _on_deadline(self) -> None:
        self._fired = True
        if self._waiting and self._task is not None:
            self._task.cancel()

    def _deadline_exceeded(self) -> DispatchFailed:
        return DispatchFailed(_error(DeadlineExceeded(
            f"request {self._rid} did not finish within {self._timeout:.3g}s", reason="REQUEST_TIMEOUT")))

    async def next(self) -> Frame | None:
        if self._fired:
            raise self._deadline_exceeded()
        self._waiting = True
        try:
            return await anext(self._frames)
        except StopAsyncIteration:
            return None
        except asyncio.CancelledError:
            if self._fired and self._task is not None and self._task.uncancel() == 0:  # the deadline's cancel only
                raise self._deadline_exceeded() from None
            raise
        except Exception as exc:
            raise DispatchFailed(_error(exc)) from None
        finally:
            self._waiting = False

    async def chunks(self) -> AsyncIterator[bytes]:
        while (frame := await self.next()) is not None:
            if isinstance(frame, bytes):
                yield frame

    async def aclose(self) -> None:
        self._timer.cancel()
        # Closes the engine responses (the engines see the disconnect and abort).
        aclose = getattr(self._frames, "aclose", None)
        if aclose is not None:
            await aclose()


class InProcessDispatchClient:
    """:class:`motor_common.openai_front.dispatch.DispatchClient` calling the dispatcher in this process."""

    def __init__(self, backend: DispatchBackend, *, request_timeout: float) -> None:
        self.backend = backend
        self.request_timeout = request_timeout

    async def dispatch(self, request_id: str, api: str, raw: bytes, body: dict[str, Any]) -> DispatchStream:
        try:
            frames = self.backend.frames(api, body, request_id)
        except Exception as exc:
            raise DispatchFailed(_error(exc)) from None
        deadline = asyncio.get_running_loop().time() + self.request_timeout
        stream = _LocalStream(frames, deadline, self.request_timeout, request_id)
        try:
            first = await stream.next()
            if not isinstance(first, CoordinatorHead):
                raise DispatchFailed(_NO_HEAD)
        except BaseException:
            await stream.aclose()
            raise
        stream.head = Head(first.http_status or 200, first.content_type)
        return stream

    async def models(self, request_id: str) -> list[ModelInfo]:
        return self.backend.models()

    async def readiness(self) -> Readiness:
        return self.backend.readiness()


class HttpFront:
    """The gateway app on ``http.host:http.port`` with the in-process client."""

    def __init__(self, backend: DispatchBackend, host: str, port: int, *, request_timeout: float,
                 api_key: str | KeyFile | None = None, shutdown_timeout: float = 10.0,
                 ssl_context: ssl.SSLContext | None = None, limits: HttpLimits | None = None,
                 admission: AdmissionConfig | None = None, reuse_port: bool = False,
                 metrics_registry: CollectorRegistry | None = None) -> None:
        self.limits = limits or HttpLimits()
        self.app = Gateway(InProcessDispatchClient(backend, request_timeout=request_timeout),
                           api_key=api_key, limits=self.limits, admission=admission,
                           metrics_registry=metrics_registry).make_app()
        self._reuse_port = reuse_port
        self.host = host
        self._port = port
        self._shutdown_timeout = shutdown_timeout
        self._ssl = ssl_context
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> int:
        self._runner, self.port = await start_site(self.app, self.host, self._port,
                                                   shutdown_timeout=self._shutdown_timeout,
                                                   ssl_context=self._ssl, limits=self.limits,
                                                   reuse_port=self._reuse_port,
                                                   bind_hint="pass --http-port or free it")
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
