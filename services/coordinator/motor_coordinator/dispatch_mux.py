"""``DispatchMany``: many Dispatch calls multiplexed on one long-lived gRPC stream.

A gateway keeps one such stream per coordinator, so the per-call cost of gRPC (call objects,
metadata, the chassis' credential check and metrics, deadline, status) is paid once per connection
instead of once per request. Every ``start`` runs as its own task, through exactly what
``Dispatch`` runs (:meth:`DispatchServicer.frames`); its frames go back under its ``stream_id``,
then ``end`` or ``error`` (the code, message and reason ``Dispatch`` would have ended with). One
writer drains the shared queue into the stream, every event waiting at that moment in one message
(so under load one gRPC message serves many requests). ``cancel`` cancels one request's task (the engine
responses are closed, as when a Dispatch call is cancelled); the stream ending cancels them all.

Flow control per request (``DispatchStart.window_bytes``, ``credit``): a request whose client asked
for a window sends a frame only while less than the window of its frames is unacknowledged; else
its Dispatch waits (inside its deadline) and so stops reading the engine's answer — what HTTP/2's
per-stream window does for a Dispatch call. A slow reader holds at most its window plus one frame
here and in the gateway; the other requests on the stream do not wait for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import grpc

from motor_common.errors import InvalidArgument, MotorError, Unavailable
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.grpc_server import printable_id
from motor_common.logs import new_request_id, request_id_var
from motor_common.tasks import TaskOwner
from motor_common.tracing import Carrier, carrier_from

log = logging.getLogger(__name__)

# Requests open at once on one stream; a start beyond it fails alone (UNAVAILABLE).
MAX_OPEN = 8192
# Bytes of frames (FRAME_COST each plus the chunk) of requests without their own window that may
# wait for the stream at once; past it those requests stop reading their engines until it drains.
MAX_QUEUED_BYTES = 16 * 1024 * 1024
# One response message carries at most this many events, and stops growing past this many bytes
# of chunks (a single larger chunk goes alone; the channels accept 64 MiB messages).
MAX_BATCH_EVENTS = 256
MAX_BATCH_BYTES = 1024 * 1024
_CODES = {c.name: c.value[0] for c in grpc.StatusCode}
# What a frame costs against its request's window: its chunk's bytes plus this (the proto's rule).
FRAME_COST = 64

Gate = Callable[[cpb.DispatchResponse], Awaitable[None]]


class Frames(Protocol):
    def __call__(self, request: cpb.DispatchRequest, degraded: bool, timeout: float | None, trace: Carrier,
                 gate: Gate | None = None, /) -> AsyncIterator[cpb.DispatchResponse]:
        """The Dispatch of one request (raises ``MotorError``); *gate*, when given, is awaited
        before each frame is yielded, inside the request's deadline (flow control)."""
        ...


def frame_cost(frame: cpb.DispatchResponse) -> int:
    return len(frame.chunk) + FRAME_COST


class Window:
    """One request's send window: frames wait while none of it is left (one frame may take it
    below zero, so a frame larger than the window still goes, alone)."""

    __slots__ = ("_open", "left")

    def __init__(self, size: int) -> None:
        self.left = size
        self._open: asyncio.Event | None = None

    async def spend(self, frame: cpb.DispatchResponse) -> None:
        while self.left <= 0:
            if self._open is None:
                self._open = asyncio.Event()
            await self._open.wait()
        self.left -= frame_cost(frame)

    def grant(self, n: int) -> None:
        self.left += n
        if self.left > 0 and self._open is not None:
            self._open.set()
            self._open = None


def error_event(stream_id: int, exc: MotorError) -> cpb.DispatchEvent:
    return cpb.DispatchEvent(stream_id=stream_id, error=cpb.DispatchError(
        code=_CODES.get(exc.code, _CODES["INTERNAL"]), message=exc.message, reason=exc.reason,
        metadata=exc.metadata))


class _End:
    """The request iterator ended (the client half-closed) or failed with ``error``."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


class _Open:
    """One request started on a stream: its task, its window (None: the stream's shared room),
    and whether the client cancelled it (its events still queued are then dropped, so a later
    request reusing the id never receives them)."""

    __slots__ = ("cancelled", "task", "window")

    def __init__(self, window: Window | None) -> None:
        self.window = window
        self.cancelled = False
        self.task: asyncio.Task[Any] | None = None


async def serve_stream(requests: AsyncIterator[cpb.DispatchManyRequest], frames: Frames
                       ) -> AsyncIterator[cpb.DispatchManyResponse]:
    """The responses of one ``DispatchMany`` stream. *frames(request, degraded, timeout, trace)* is the
    Dispatch of one request (raises ``MotorError``); *trace* its caller's trace context. Events waiting when the stream can take a
    message go out together (at most :data:`MAX_BATCH_EVENTS` / about :data:`MAX_BATCH_BYTES`)."""
    out: asyncio.Queue[tuple[_Open | None, cpb.DispatchEvent] | _End] = asyncio.Queue()
    running: dict[int, _Open] = {}
    # Requests without a window of their own share this one: what is queued here but not yet
    # taken by the stream stays under MAX_QUEUED_BYTES, so a client that stops reading holds
    # that much (and its engine reads stop) instead of every answer in full.
    room = Window(MAX_QUEUED_BYTES)
    tasks = TaskOwner("dispatch-many")

    async def one(stream_id: int, start: cpb.DispatchStart, req: _Open) -> None:
        request = start.request
        rid = request.request_id
        request_id_var.set(rid if rid and printable_id(rid) else new_request_id())
        timeout = start.timeout_ms / 1000 if start.timeout_ms else None
        gate = room.spend if req.window is None else req.window.spend
        try:
            trace = carrier_from(start.trace_context)
            async for frame in frames(request, start.degraded, timeout, trace, gate):
                out.put_nowait((req, cpb.DispatchEvent(stream_id=stream_id, frame=frame)))
            final = cpb.DispatchEvent(stream_id=stream_id, end=True)
        except MotorError as exc:
            final = error_event(stream_id, exc)
        except Exception:
            rid = request_id_var.get()
            log.exception("unhandled error in DispatchMany (request id %s)", rid)
            final = error_event(stream_id, MotorError(
                f"internal error in Dispatch; the server log has the details under request id {rid}",
                metadata={"request_id": rid}))
        finally:
            if running.get(stream_id) is req:  # not if cancelled: the id may name a new request
                del running[stream_id]
        out.put_nowait((req, final))

    def command(cmd: cpb.DispatchCommand) -> None:
        sid = cmd.stream_id
        kind = cmd.WhichOneof("kind")
        if kind == "credit":
            req = running.get(sid)
            if req is not None and req.window is not None:
                req.window.grant(cmd.credit)
        elif kind == "cancel":
            req = running.pop(sid, None)
            if req is not None:
                req.cancelled = True
                assert req.task is not None
                req.task.cancel()
        elif kind == "start":
            if sid == 0 or sid in running:
                out.put_nowait((None, error_event(sid, InvalidArgument(
                    f"stream_id {sid} is 0 or already names an open request on this stream",
                    reason="INVALID_STREAM_ID"))))
            elif len(running) >= MAX_OPEN:
                out.put_nowait((None, error_event(sid, Unavailable(
                    f"more than {MAX_OPEN} requests open on one DispatchMany stream",
                    reason="TOO_MANY_OPEN_REQUESTS"))))
            else:
                req = _Open(Window(cmd.start.window_bytes) if cmd.start.window_bytes else None)
                running[sid] = req
                req.task = tasks.spawn(one(sid, cmd.start, req), name=f"dispatch-many-{sid}")

    async def read() -> None:
        error: BaseException | None = None
        try:
            async for message in requests:
                for cmd in message.commands:
                    command(cmd)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:  # an invalid message (unknown field) or the client's stream broke
            error = exc
        out.put_nowait(_End(error))

    reader = asyncio.get_running_loop().create_task(read(), name="dispatch-many-reader")
    ended = False
    try:
        while True:
            batch: list[cpb.DispatchEvent] = []
            size = 0
            shared = 0  # bytes of the batch charged to the shared room
            item = await out.get()
            while True:
                if isinstance(item, _End):
                    if item.error is not None:
                        raise item.error
                    ended = True
                else:
                    req, event = item
                    cost = frame_cost(event.frame) if event.HasField("frame") else 0
                    if req is not None and req.window is None:
                        shared += cost
                    if req is None or not req.cancelled:
                        batch.append(event)
                        size += cost or FRAME_COST
                if out.empty() or len(batch) >= MAX_BATCH_EVENTS or size >= MAX_BATCH_BYTES:
                    break
                item = out.get_nowait()
            if batch:
                yield cpb.DispatchManyResponse(events=batch)
            if shared:
                room.grant(shared)  # taken by the stream (or dropped): room for more
            if ended and not running and out.empty():
                return
    finally:
        reader.cancel()
        await tasks.close()
        await asyncio.gather(reader, return_exceptions=True)
