"""HTTP/1.1 to engines on bare asyncio protocols: the dispatch legs (a prefill's whole answer, a
decode's or union's answer streamed) without an HTTP client framework.

Why not aiohttp's client, which the probes and scrapes still use: per request it builds a
``ClientRequest``, a ``ClientResponse``, a connector lookup, a timer context and a payload object,
and with two engine legs per PD request that was the largest single cost of the coordinator's
hot path (``bench/http_stack.py``: the same relay with this client instead of aiohttp's takes
about half the CPU per request, docs/benchmarks.md). Here a request is one prepared ``bytes`` on a
pooled keep-alive connection, the answer parsed by httptools (llhttp, the C parser aiohttp's
own speedups use) in the protocol's callbacks.

What the dispatcher relies on is kept: an answer's status and headers once its head arrived,
its body as it comes (``readany``/``read``; cancelling a read loses nothing), a connection
dropped rather than reused when the caller leaves early (the engine sees the disconnect and
aborts), reading paused while more than :data:`HIGH_WATER` bytes wait for the caller (a slow
client holds a bounded amount), gzip/deflate bodies decoded only as they are read (a small
body that expands is bounded by its reader), and a body that breaks off raising
:class:`BrokenAnswer` (an ``aiohttp.ClientPayloadError``, which the dispatcher already treats as
a broken answer)."""

from __future__ import annotations

import asyncio
import socket
import time
import zlib
from collections import deque
from typing import cast

import aiohttp
import httptools

from motor_common.openai_front.limits import deflate_wbits
from motor_common.ports import host_port

# A connection's reading pauses while this many bytes of its answer wait to be read, and resumes
# below LOW_WATER (aiohttp's client paused at 2 x 64 KiB).
HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024
# Decoded bytes produced per read of a compressed body.
DECODE_STEP = 64 * 1024
# Bytes an engine may send before its answer's head is complete (status line, headers and any 1xx
# interim answers), counted per read: the parser buffers a header until its end, so an endless one
# is cut once a read leaves the head incomplete past this.
MAX_HEAD_BYTES = 64 * 1024


class BrokenAnswer(aiohttp.ClientPayloadError):
    """The engine's answer broke off after its head: the connection closed before the body's end,
    the framing or the content coding was invalid."""


class HeadLost(ConnectionError):
    """The connection closed (or the answer was unparseable) before the answer's head."""


class Headers:
    """An answer's headers, looked up case-insensitively (the last value of a repeated name)."""

    __slots__ = ("_d",)

    def __init__(self, d: dict[str, str]) -> None:
        self._d = d

    def get(self, name: str, default: str = "") -> str:
        return self._d.get(name.lower(), default)

    def __contains__(self, name: str) -> bool:
        return name.lower() in self._d


class AnswerBody:
    """An answer's body as it arrives: what the dispatcher reads (``readany``, ``read``)."""

    __slots__ = ("_chunks", "_conn", "_decoder", "_eof", "_exc", "_paused", "_size", "_sniff", "_waiter")

    def __init__(self, conn: EngineConnection, decoder: zlib._Decompress | None, *, sniff: bool = False) -> None:
        """*sniff*: ``deflate``, which senders use for zlib-wrapped and raw deflate data alike: the
        first bytes decide which (``openai_front.limits.deflate_wbits``, as the front reads request
        bodies; aiohttp's client accepted both too)."""
        self._conn = conn
        self._decoder = decoder
        self._sniff = sniff
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._eof = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False

    # --- fed by the connection
    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        if self._size > HIGH_WATER and not self._paused:
            self._paused = True
            self._conn.pause_reading()
        self._wake()

    def feed_eof(self) -> None:
        self._eof = True
        self._wake()

    def fail(self, exc: BaseException) -> None:
        if not self._eof:
            self._exc = exc
            self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    @property
    def paused(self) -> bool:
        return self._paused

    # --- read by the dispatcher
    async def _wait(self) -> None:
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _take(self, limit: int) -> bytes:
        chunk = self._chunks.popleft()
        if len(chunk) > limit:
            chunk, rest = chunk[:limit], chunk[limit:]
            self._chunks.appendleft(rest)
        self._size -= len(chunk)
        if self._paused and self._size < LOW_WATER:
            self._paused = False
            self._conn.resume_reading()
        return chunk

    async def _raw(self, limit: int) -> bytes:
        """Up to *limit* bytes as they came off the wire; b"" at the end."""
        while not self._chunks:
            if self._exc is not None:
                raise self._exc
            if self._eof:
                return b""
            await self._wait()
        return self._take(limit)

    async def read(self, n: int = -1) -> bytes:
        """What has arrived, at most *n* bytes (all of the body for ``n < 0``); b"" at the end."""
        if n < 0:
            parts = []
            while chunk := await self.read(DECODE_STEP):
                parts.append(chunk)
            return b"".join(parts)
        d = self._decoder
        if d is None:
            return await self._raw(n)
        while True:  # decode only as much as is asked for: a small body may expand a thousandfold
            if d.unconsumed_tail:
                data = d.unconsumed_tail
            else:
                data = await self._raw(1 << 16)
                if self._sniff and data:
                    self._sniff = False
                    d = self._decoder = zlib.decompressobj(wbits=deflate_wbits(data))
                if not data:
                    if d.eof:
                        return b""
                    out = d.flush()
                    if not d.eof:  # the decoder stays: the next read raises this again
                        raise BrokenAnswer("the engine's compressed answer ended before its end")
                    return out
            try:
                out = d.decompress(data, min(n, DECODE_STEP))
            except zlib.error as exc:
                raise BrokenAnswer(f"the engine's compressed answer is invalid: {exc}") from None
            if out:
                return out

    async def readany(self) -> bytes:
        return await self.read(DECODE_STEP if self._decoder is not None else 1 << 30)


class EngineResponse:
    """One engine answer once its head arrived; the caller ends it with :meth:`release` (the
    connection is reused if the whole answer was read) or :meth:`close` (it is dropped). Only the
    first of them counts: once released, the connection may carry another request, which a later
    ``close()`` of this answer must not drop (aiohttp's responses, which these replaced, allowed it)."""

    __slots__ = ("_conn", "_ended", "content", "headers", "host_port", "status")

    def __init__(self, conn: EngineConnection, status: int, headers: Headers, content: AnswerBody,
                 host_port: str) -> None:
        self._conn = conn
        self._ended = False
        self.status = status
        self.headers = headers
        self.content = content
        self.host_port = host_port

    def release(self) -> None:
        if not self._ended:
            self._ended = True
            self._conn.finish(reuse=True)

    def close(self) -> None:
        if not self._ended:
            self._ended = True
            self._conn.finish(reuse=False)


class EngineConnection(asyncio.Protocol):
    """A keep-alive HTTP/1.1 connection to one engine, one request at a time."""

    def __init__(self, pool: EnginePool) -> None:
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self._head: asyncio.Future[EngineResponse] | None = None
        self._body: AnswerBody | None = None
        self._headers: dict[str, str] = {}
        self._framed = False  # Content-Length or chunked: the body's end is not the connection's
        self._complete = False
        self._keepalive = False
        self._finished = False
        self._head_bytes = 0

    # --- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self._head is None or self._complete:
            # Bytes no request waits for (idle in the pool, or after the answer's end): the next
            # answer on this connection could not be told from them. Not reused.
            self._keepalive = False
            if self._head is None:
                self.drop()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._broken(f"the engine's answer is not valid HTTP/1.1: {exc}")
            self.drop()
            return
        except httptools.HttpParserUpgrade:  # not an HttpParserError: it escaped, asyncio logged a fatal error
            self._broken("the engine answered HTTP 101 (switching protocols)")
            self.drop()
            return
        if self._body is None:  # still no head: at most one read past the bound is held
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._broken(f"the engine's answer head is longer than {MAX_HEAD_BYTES} bytes")
                self.drop()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.pool.forget(self)
        if self._head is not None and not self._head.done():
            self._head.set_exception(HeadLost(f"the engine closed the connection before answering ({exc})"
                                              if exc else "the engine closed the connection before answering"))
        elif self._body is not None and not self._complete:
            if self._framed:
                self._body.fail(BrokenAnswer("the engine closed the connection before the end of its answer"))
            else:
                self._complete = True
                self._body.feed_eof()  # an answer without Content-Length or chunks ends with its connection

    def pause_reading(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    # --- httptools callbacks
    def on_message_begin(self) -> None:
        if self._complete:  # a second answer in the bytes of the first (see data_received)
            self._keepalive = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._body is None:  # not a chunked answer's trailer, which would change the answer's headers
            self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        head = self._head
        if head is None or head.done():
            return
        status = self.parser.get_status_code()
        if status < 200:  # 1xx: an interim answer (never asked for); the real head follows
            self._headers = {}
            return
        h = self._headers
        self._framed = "content-length" in h or "chunked" in h.get("transfer-encoding", "").lower()
        coding = h.get("content-encoding", "identity").strip().lower()
        decoder = None
        if coding in ("gzip", "x-gzip", "deflate"):
            # gzip: 32 + 15, a gzip (or zlib) header detected; deflate: replaced at its first bytes
            decoder = zlib.decompressobj(wbits=47)
        elif coding not in ("identity", ""):
            self._broken(f"the engine's answer has a content coding the coordinator does not decode: {coding!r}")
            self.drop()
            return
        self._body = AnswerBody(self, decoder, sniff=coding == "deflate")
        head.set_result(EngineResponse(self, status, Headers(h), self._body, self.pool.host_port))

    def on_body(self, body: bytes) -> None:
        if self._body is not None and not self._complete:
            self._body.feed(body)

    def on_message_complete(self) -> None:
        if self._body is None or self._complete:  # the end of a 1xx answer, or of stray bytes
            return
        self._complete = True
        self._keepalive = self.parser.should_keep_alive()  # False: the engine said Connection: close
        self._body.feed_eof()
        if self._finished:
            self._recycle()

    # --- the request
    def send(self, request: bytes) -> asyncio.Future[EngineResponse]:
        assert self.transport is not None
        self._head = asyncio.get_running_loop().create_future()
        self._body, self._headers = None, {}
        self._framed = self._complete = self._keepalive = self._finished = False
        self._head_bytes = 0
        self.transport.write(request)
        return self._head

    def finish(self, *, reuse: bool) -> None:
        """The caller is done with the answer: back to the pool if it was read to its end."""
        if self._finished:
            return
        self._finished = True
        if reuse and self._complete:
            self._recycle()
        else:
            self.drop()

    def _recycle(self) -> None:
        t = self.transport
        if t is None or t.is_closing() or not self._keepalive:
            self.drop()
            return
        if self._body is not None and self._body.paused:
            t.resume_reading()  # the answer is complete; what the caller left unread is dropped
        self._head, self._body = None, None
        self.pool.release(self)

    def _broken(self, why: str) -> None:
        if self._head is not None and not self._head.done():
            self._head.set_exception(HeadLost(why))
        elif self._body is not None:
            self._body.fail(BrokenAnswer(why))

    def drop(self) -> None:
        t = self.transport
        if t is not None:
            t.abort()  # not reused: the engine sees the disconnect (an abandoned request is aborted)


class EnginePool:
    """Idle keep-alive connections to one engine (most recently used first)."""

    def __init__(self, host: str, port: int, keepalive: float) -> None:
        self.host, self.port = host, port
        self.host_port = host_port(host, port)
        self.keepalive = keepalive
        self.idle: list[EngineConnection] = []

    def idle_connection(self) -> EngineConnection | None:
        """The most recently used idle connection still open and within ``keepalive``, if any."""
        now = time.monotonic()
        while self.idle:
            conn = self.idle.pop()
            t = conn.transport
            if t is not None and not t.is_closing() and now - conn.idle_since < self.keepalive:
                return conn
            conn.drop()
        return None

    async def connect(self, connect_timeout: float) -> EngineConnection:
        """A new connection (``TimeoutError`` after *connect_timeout*, ``OSError`` if refused)."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(connect_timeout):
            _, conn = await loop.create_connection(lambda: EngineConnection(self), self.host, self.port)
        return conn

    def release(self, conn: EngineConnection) -> None:
        conn.idle_since = time.monotonic()
        self.idle.append(conn)

    def forget(self, conn: EngineConnection) -> None:
        if conn in self.idle:
            self.idle.remove(conn)

    def close(self) -> None:
        idle, self.idle = self.idle, []
        for conn in idle:
            conn.drop()


def request_bytes(method: str, path: str, host_port: str, headers: dict[str, str], body: bytes | None) -> bytes:
    """The request as it goes on the wire. Header values are the caller's checked values (request
    ids and trace headers are printable ASCII, validated where they came in); a CR or LF here would
    split the request, so it is refused."""
    if not path.startswith("/") or not path.isascii() or any(c in path for c in " \r\n\t"):
        raise ValueError(f"not a request target: {path[:100]!r}")
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host_port}", "Accept-Encoding: gzip, deflate"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name!r} has a line break")
        lines.append(f"{name}: {value}")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body if body else head
