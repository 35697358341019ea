"""The gateway's side of ``DispatchMany``: one long-lived stream per coordinator carrying every
request, instead of one gRPC call per request (the call's setup, metadata, credential check and
status are paid once per stream).

:meth:`DispatchMux.dispatch` returns a :class:`MuxCall` with the part of grpc.aio's
``UnaryStreamCall`` the gateway uses (``read`` → a ``DispatchResponse`` or ``grpc.aio.EOF``,
``cancel``, ``done``), failing with the same ``grpc.aio.AioRpcError`` a Dispatch call would (code,
details, ErrorInfo reason in the trailing metadata), so failover (``motor_gateway.failover``) and
error mapping (``motor_gateway.client``) treat both alike. The stream opens at the first request;
when it breaks (coordinator gone, keepalive timeout), every request open on it fails with the
stream's error (UNAVAILABLE: retryable before the head) and the next request opens a new one. A
coordinator without ``DispatchMany`` (UNIMPLEMENTED: an older version) gets unary Dispatch calls
from then on (:attr:`DispatchMux.supported`).

Client-certificate rotation (``motor_common.reloading_channel``): before each request the mux asks
the channel for its current connection; when the certificate files changed, the request opens a new
stream on the new connection (it presents the new certificate), and the old stream is *retired*:
it takes no new request, its open requests finish on it, and it is half-closed when the last one
ends (the coordinator then ends it, and the old connection closes). A retired stream still open at
the channel's drain time is cut; its open requests fail UNAVAILABLE like any broken stream.

Commands waiting when the stream can take a message go out together, as the coordinator sends the
events of many requests in one message: under load one gRPC message serves many requests.
A request's frames wait in its own queue until the HTTP side reads them; a slow HTTP client
never stalls the others. The queue is bounded by per-request flow control: each request asks for
a window of :data:`WINDOW_BYTES` (``DispatchStart.window_bytes``) and gives credit back
(``credit`` commands, every :data:`CREDIT_STEP` bytes) as the HTTP side takes its frames, so the
coordinator holds back a slow reader's answer (and stops reading its engine) instead of this
process buffering all of it. ``motor_gateway_dispatch_buffered_bytes`` shows what is queued.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any

import grpc
from prometheus_client import Gauge

from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_server import status_details
from motor_common.reloading_channel import ReloadingChannel
from motor_common.tasks import TaskOwner

log = logging.getLogger(__name__)

_CODES = {c.value[0]: c for c in grpc.StatusCode}
# One message carries at most this many commands, and stops growing past this many body bytes.
MAX_BATCH_COMMANDS = 256
MAX_BATCH_BYTES = 1024 * 1024
_EOF: Any = grpc.aio.EOF
# Per-request flow control: at most this many bytes of one request's frames (chunk bytes + 64 per
# frame, the proto's rule) are on their way or queued here; credit goes back every CREDIT_STEP.
WINDOW_BYTES = 256 * 1024
CREDIT_STEP = WINDOW_BYTES // 4
FRAME_COST = 64

_MUXES: weakref.WeakSet[DispatchMux] = weakref.WeakSet()
BUFFERED = Gauge(
    "motor_gateway_dispatch_buffered_bytes",
    "Bytes of answers received on DispatchMany streams and not yet taken by the HTTP side (frames "
    "counted as chunk bytes + 64), over all coordinators; per-request flow control bounds each "
    "request's share. Updated when a request's share crosses a multiple of 64 KiB and when such a "
    "request ends (within 64 KiB per open request of the exact figure).",
    multiprocess_mode="livesum",
)


def _publish() -> None:
    """Set the gauge to what this process holds now (not per frame: a gauge update costs about a
    microsecond, in multiprocess mode more)."""
    BUFFERED.set(sum(m.queued for m in list(_MUXES)))


def _error(code: grpc.StatusCode, details: str, trailing: grpc.aio.Metadata | None = None) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing or grpc.aio.Metadata(), details)


def _request_error(err: cpb.DispatchError) -> grpc.aio.AioRpcError:
    """The AioRpcError a Dispatch call ending with *err*'s status raises."""
    code = _CODES.get(err.code, grpc.StatusCode.UNKNOWN)
    details = status_details(code, err.message, err.reason, dict(err.metadata))
    return _error(code, err.message, grpc.aio.Metadata(("grpc-status-details-bin", details)))


class MuxCall:
    """One request on a DispatchMany stream."""

    __slots__ = ("_deadline", "_done", "_frames", "_shown", "_stream", "_taken", "queued", "stream_id")

    def __init__(self, stream: _Stream, stream_id: int, deadline: float) -> None:
        self._stream = stream
        self.stream_id = stream_id
        self._deadline = deadline
        self._frames: asyncio.Queue[Any] = asyncio.Queue()
        self._done = False
        self.queued = 0  # bytes of frames delivered and not yet read (FRAME_COST each + chunk)
        self._taken = 0  # bytes read and not yet given back as credit
        self._shown = False  # its share was published in motor_gateway_dispatch_buffered_bytes

    def deliver(self, item: Any) -> None:
        """A frame, ``grpc.aio.EOF`` or the AioRpcError the request ended with."""
        if isinstance(item, cpb.DispatchResponse):
            cost = len(item.chunk) + FRAME_COST
            before = self.queued
            self.queued += cost
            self._stream.mux.queued += cost
            if before // CREDIT_STEP != self.queued // CREDIT_STEP:
                self._shown = True
                _publish()
        self._frames.put_nowait(item)

    async def read(self) -> Any:
        """The next ``DispatchResponse``, or ``grpc.aio.EOF`` after the last; raises the request's
        ``AioRpcError`` (DEADLINE_EXCEEDED at its deadline, like a gRPC call)."""
        if not self._frames.empty():  # already here (the usual case under load): no deadline timer
            item = self._frames.get_nowait()
        else:
            try:
                async with asyncio.timeout_at(self._deadline):
                    item = await self._frames.get()
            except TimeoutError:
                self.cancel()
                raise _error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        if isinstance(item, grpc.aio.AioRpcError):
            self._finish()
            raise item
        if item is _EOF:
            self._finish()
            return item
        cost = len(item.chunk) + FRAME_COST
        before = self.queued
        self.queued -= cost
        self._stream.mux.queued -= cost
        if before // CREDIT_STEP != self.queued // CREDIT_STEP:
            self._shown = True
            _publish()
        self._taken += cost
        if self._taken >= CREDIT_STEP and not self._done:
            self._stream.credit(self.stream_id, self._taken)
            self._taken = 0
        return item

    def _finish(self) -> None:
        self._done = True
        self._stream.mux.queued -= self.queued  # frames nobody will read are dropped with the call
        self.queued = 0
        if self._shown:  # the gauge showed this request's share: show it gone
            _publish()

    def done(self) -> bool:
        return self._done

    def cancel(self) -> bool:
        """Stop the request (client gone, route moved): the coordinator aborts it."""
        if self._done:
            return False
        self._finish()
        self._stream.cancel(self.stream_id)
        return True


class _Stream:
    """One DispatchMany call, its writer and reader tasks and the requests open on it."""

    def __init__(self, mux: DispatchMux, call: Any, channel: Any = None) -> None:
        self.mux = mux
        self.call = call
        self.channel = channel  # the connection it runs on (a ReloadingChannel's current one)
        self.calls: dict[int, MuxCall] = {}
        self.outbox: asyncio.Queue[cpb.DispatchCommand | None] = asyncio.Queue()  # None: half-close
        self.broken = False
        self.retired = False
        self.writer: asyncio.Task[Any] | None = None

    def retire(self) -> None:
        """Take no new request; half-close once the open ones have ended."""
        self.retired = True
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        if self.retired and not self.calls and not self.broken:
            self.outbox.put_nowait(None)

    def start(self, request: cpb.DispatchRequest, timeout: float, degraded: bool, trace: dict[str, str]) -> MuxCall:
        sid = self.mux.next_id()
        loop = asyncio.get_running_loop()
        call = MuxCall(self, sid, loop.time() + timeout)
        self.calls[sid] = call
        self.outbox.put_nowait(cpb.DispatchCommand(stream_id=sid, start=cpb.DispatchStart(
            request=request, timeout_ms=max(1, min(int(timeout * 1000), 2**32 - 1)), degraded=degraded,
            trace_context=trace, window_bytes=WINDOW_BYTES)))
        return call

    def credit(self, sid: int, n: int) -> None:
        """The HTTP side took *n* more bytes of request *sid*'s frames: the coordinator may send more."""
        if sid in self.calls and not self.broken:
            self.outbox.put_nowait(cpb.DispatchCommand(stream_id=sid, credit=n))

    def cancel(self, sid: int) -> None:
        if self.calls.pop(sid, None) is not None and not self.broken:
            self.outbox.put_nowait(cpb.DispatchCommand(stream_id=sid, cancel=True))
            self._close_if_idle()

    async def write(self) -> None:
        write = self.call.write
        outbox = self.outbox
        try:
            while True:
                # Every command waiting goes in one message (bounded like the coordinator's batches).
                first = await outbox.get()
                if first is None:  # retired and idle: the coordinator ends the stream
                    await self.call.done_writing()
                    return
                batch = [first]
                size = len(first.start.request.body)
                while not outbox.empty() and len(batch) < MAX_BATCH_COMMANDS and size < MAX_BATCH_BYTES:
                    cmd = outbox.get_nowait()
                    if cmd is None:
                        outbox.put_nowait(None)  # after this batch
                        break
                    batch.append(cmd)
                    size += len(cmd.start.request.body)
                await write(cpb.DispatchManyRequest(commands=batch))
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as exc:
            # The stream is over; the reader sees why and fails the open requests.
            log.debug("DispatchMany write failed: %s", exc)
        except Exception as exc:  # grpc's ExecuteBatchError (a write after the call ended)
            if "grpc" not in type(exc).__module__:
                raise
            log.debug("DispatchMany write failed: %s", exc)

    async def read(self) -> None:
        read = self.call.read
        calls = self.calls
        try:
            while (msg := await read()) is not _EOF:
                for ev in msg.events:
                    kind = ev.WhichOneof("kind")
                    if kind == "frame":
                        call = calls.get(ev.stream_id)
                        if call is not None:
                            call.deliver(ev.frame)
                    elif kind == "end":
                        call = calls.pop(ev.stream_id, None)
                        if call is not None:
                            call.deliver(_EOF)
                            self._close_if_idle()
                    elif kind == "error":
                        call = calls.pop(ev.stream_id, None)
                        if call is not None:
                            call.deliver(_request_error(ev.error))
                            self._close_if_idle()
            exc = _error(grpc.StatusCode.UNAVAILABLE, "the coordinator ended the DispatchMany stream")
        except grpc.aio.AioRpcError as err:
            exc = err
        except asyncio.CancelledError:
            # grpc.aio ends a call whose channel was closed under it with CancelledError although
            # this task was not cancelled: a retired stream cut at its channel's drain time.
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise
            exc = _error(grpc.StatusCode.UNAVAILABLE, "the DispatchMany stream's connection was closed")
        self.fail(exc)

    def fail(self, exc: grpc.aio.AioRpcError) -> None:
        """The stream is over: every request still open on it fails with *exc*."""
        self.broken = True
        if self.writer is not None:
            self.writer.cancel()
        self.mux.ended(self, exc)
        calls = list(self.calls.values())
        self.calls.clear()
        for call in calls:
            call.deliver(exc)


class DispatchMux:
    """The DispatchMany stream to one coordinator (opened on first use, reopened after a break)."""

    def __init__(self, stub: cgrpc.DispatchServiceStub, address: str, channel: Any = None) -> None:
        self._stub = stub
        self.address = address
        self._channel = channel if isinstance(channel, ReloadingChannel) else None
        self._stream: _Stream | None = None
        self._next = 0
        self._tasks = TaskOwner(f"dispatch-mux {address}")
        # False once the coordinator answered UNIMPLEMENTED (no DispatchMany): unary calls then.
        self.supported = True
        self.opened = 0  # streams opened so far (logs, tests)
        self.queued: int = 0  # bytes of frames delivered to requests and not yet read by the HTTP side
        _MUXES.add(self)

    def next_id(self) -> int:
        self._next += 1
        return self._next

    def dispatch(self, request: cpb.DispatchRequest, *, timeout: float, degraded: bool, trace: dict[str, str],
                 metadata: tuple[tuple[str, str], ...]) -> MuxCall:
        """Send *request* on the stream (opened with *metadata*, the credential, if there is none);
        *trace*: its W3C trace context headers."""
        stream = self._stream
        # Checks the certificate files: a rotation gives a new connection, the new request a new stream.
        connection = self._channel.current() if self._channel is not None else None
        if stream is not None and stream.channel is not connection:
            self._stream = None
            stream.retire()
            stream = None
        if stream is None:
            stream = self._stream = _Stream(self, self._stub.DispatchMany(metadata=metadata), connection)
            self.opened += 1
            stream.writer = self._tasks.spawn(stream.write(), name=f"dispatch-mux-write {self.address}")
            self._tasks.spawn(stream.read(), name=f"dispatch-mux-read {self.address}")
        return stream.start(request, timeout, degraded, trace)

    def ended(self, stream: _Stream, exc: grpc.aio.AioRpcError) -> None:
        if self._stream is stream:
            self._stream = None
        if not stream.call.done():
            stream.call.cancel()
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
            if self.supported:
                log.warning("coordinator has no DispatchMany (older version): one Dispatch call per request",
                            extra={"coordinator": self.address})
            self.supported = False
        elif exc.code() != grpc.StatusCode.CANCELLED and not (stream.retired and not stream.calls):
            log.info("DispatchMany stream ended", extra={"coordinator": self.address, "code": exc.code().name,
                                                         "detail": exc.details(), "open": len(stream.calls)})

    async def close(self) -> None:
        stream, self._stream = self._stream, None
        await self._tasks.close()
        if stream is not None and not stream.call.done():
            stream.call.cancel()
