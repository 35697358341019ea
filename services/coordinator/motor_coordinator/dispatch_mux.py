"""``DispatchMany``: many Dispatch calls multiplexed on one long-lived gRPC stream.

A gateway keeps one such stream per coordinator, so the per-call cost of gRPC (call objects,
metadata, the chassis' credential check and metrics, deadline, status) is paid once per connection
instead of once per request. Every ``start`` runs as its own task, through exactly what
``Dispatch`` runs (:meth:`DispatchServicer.frames`); its frames go back under its ``stream_id``,
then ``end`` or ``error`` (the code, message and reason ``Dispatch`` would have ended with). One
writer drains the shared queue into the stream, every event waiting at that moment in one message
(so under load one gRPC message serves many requests). ``cancel`` cancels one request's task (the engine
responses are closed, as when a Dispatch call is cancelled); the stream ending cancels them all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from motor_common.errors import InvalidArgument, MotorError, Unavailable
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.logs import new_request_id, request_id_var
from motor_common.tasks import TaskOwner
from motor_common.tracing import Carrier, carrier_from

log = logging.getLogger(__name__)

# Requests open at once on one stream; a start beyond it fails alone (UNAVAILABLE).
MAX_OPEN = 8192
# One response message carries at most this many events, and stops growing past this many bytes
# of chunks (a single larger chunk goes alone; the channels accept 64 MiB messages).
MAX_BATCH_EVENTS = 256
MAX_BATCH_BYTES = 1024 * 1024
_CODES = {c.name: c.value[0] for c in grpc.StatusCode}

Frames = Callable[[cpb.DispatchRequest, bool, float | None, Carrier], AsyncIterator[cpb.DispatchResponse]]


def error_event(stream_id: int, exc: MotorError) -> cpb.DispatchEvent:
    return cpb.DispatchEvent(stream_id=stream_id, error=cpb.DispatchError(
        code=_CODES.get(exc.code, _CODES["INTERNAL"]), message=exc.message, reason=exc.reason,
        metadata=exc.metadata))


class _End:
    """The request iterator ended (the client half-closed) or failed with ``error``."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


async def serve_stream(requests: AsyncIterator[cpb.DispatchManyRequest], frames: Frames
                       ) -> AsyncIterator[cpb.DispatchManyResponse]:
    """The responses of one ``DispatchMany`` stream. *frames(request, degraded, timeout, trace)* is the
    Dispatch of one request (raises ``MotorError``); *trace* its caller's trace context. Events waiting when the stream can take a
    message go out together (at most :data:`MAX_BATCH_EVENTS` / about :data:`MAX_BATCH_BYTES`)."""
    out: asyncio.Queue[cpb.DispatchEvent | _End] = asyncio.Queue()
    running: dict[int, asyncio.Task[Any]] = {}
    tasks = TaskOwner("dispatch-many")

    async def one(stream_id: int, start: cpb.DispatchStart) -> None:
        request = start.request
        request_id_var.set(request.request_id or new_request_id())
        timeout = start.timeout_ms / 1000 if start.timeout_ms else None
        try:
            async for frame in frames(request, start.degraded, timeout, carrier_from(start.trace_context)):
                out.put_nowait(cpb.DispatchEvent(stream_id=stream_id, frame=frame))
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
            running.pop(stream_id, None)
        out.put_nowait(final)

    def command(cmd: cpb.DispatchCommand) -> None:
        sid = cmd.stream_id
        kind = cmd.WhichOneof("kind")
        if kind == "cancel":
            task = running.pop(sid, None)
            if task is not None:
                task.cancel()
        elif kind == "start":
            if sid == 0 or sid in running:
                out.put_nowait(error_event(sid, InvalidArgument(
                    f"stream_id {sid} is 0 or already names an open request on this stream",
                    reason="INVALID_STREAM_ID")))
            elif len(running) >= MAX_OPEN:
                out.put_nowait(error_event(sid, Unavailable(
                    f"more than {MAX_OPEN} requests open on one DispatchMany stream",
                    reason="TOO_MANY_OPEN_REQUESTS")))
            else:
                running[sid] = tasks.spawn(one(sid, cmd.start), name=f"dispatch-many-{sid}")

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
            item = await out.get()
            while True:
                if isinstance(item, _End):
                    if item.error is not None:
                        raise item.error
                    ended = True
                else:
                    batch.append(item)
                    size += len(item.frame.chunk) if item.HasField("frame") else 64
                if out.empty() or len(batch) >= MAX_BATCH_EVENTS or size >= MAX_BATCH_BYTES:
                    break
                item = out.get_nowait()
            if batch:
                yield cpb.DispatchManyResponse(events=batch)
            if ended and not running and out.empty():
                return
    finally:
        reader.cancel()
        await tasks.close()
        await asyncio.gather(reader, return_exceptions=True)
