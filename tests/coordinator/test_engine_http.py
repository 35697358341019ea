"""The coordinator's HTTP/1.1 client for the dispatch legs (``engine_http``, used through
``EngineClient.open``/``post``/``read_all``), against real servers on 127.0.0.1.

aiohttp web servers stand in for engines for the ordinary shapes; raw ``asyncio.start_server``
servers that write exact bytes for what aiohttp will not send (an answer cut short, no length,
garbage, 1xx, 101, ``Connection: close``). Covered:

- bodies with Content-Length, chunked, and ending with the connection, byte-exact; status and
  case-insensitive headers;
- keep-alive: one TCP connection for sequential requests; not reused after ``Connection: close``,
  after an HTTP/1.0 answer, past ``keepalive`` idle, or once the engine closed it; ending an
  answer a second time does not touch the request its connection carries next;
- leaving early (``close()``, an exception in ``post``, ``release()`` before the end) drops the
  connection: the engine sees the disconnect, the next request opens a new one; cancelling while
  waiting for the head does the same and leaves nothing pooled;
- flow control: a client that reads nothing holds a bounded number of bytes of a 16 MiB answer,
  then reads all of it in order; an answer complete while paused, released unread, leaves a
  connection that reads the next answer;
- gzip/deflate decoded byte-exact and in bounded steps (a ~16 KiB body expanding to 16 MiB), an
  unsupported coding refused, a corrupt or truncated compressed body a ``BrokenAnswer``;
- broken answers (cut mid-body, closed before or mid-head, garbage, nothing listening), 1xx
  interim answers, 101, redirects (not followed, nothing broken left pooled);
- the request bytes (request line, Host, X-Request-Id, Content-Type, JSON body; GET without a
  body), header values with CR/LF refused before anything is sent;
- a cancelled ``readany()`` loses no byte.

No test may make asyncio (or the servers) log an error: a protocol callback that raises is logged
as a fatal error and its connection closed, which a request's outcome alone would not show.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import socket
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.typedefs import Handler

from motor_common.domain import Endpoint
from motor_coordinator import engine_http
from motor_coordinator.engine_client import EngineClient, EngineUnreachable
from motor_coordinator.engine_http import DECODE_STEP, HIGH_WATER, BrokenAnswer, EngineResponse
from tests.helpers import wait_for

MIB = 1 << 20
# What one read of a socket may hand the protocol past the pause (asyncio's selector transport
# reads at most 256 KiB at a time).
ONE_READ = 256 * 1024
BODY = {"model": "m", "prompt": "héllo \"quoted\"", "max_tokens": 3}


def endpoint(port: int) -> Endpoint:
    return Endpoint(0, "127.0.0.1", port)


@pytest_asyncio.fixture
async def client() -> AsyncIterator[EngineClient]:
    c = EngineClient(connect_timeout=2, probe_timeout=2, keepalive=30)
    await c.start()
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture(autouse=True)
def no_loop_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Nothing logged as an error: a protocol callback that raised (asyncio logs "Fatal error"
    and closes the connection) fails the test even if the request ended as expected."""
    yield
    errors = [r.getMessage() for r in caplog.get_records("call") if r.levelno >= logging.ERROR]
    assert errors == []


def pooled(c: EngineClient, port: int) -> list[engine_http.EngineConnection]:
    """The idle keep-alive connections *c* holds to the engine on *port*."""
    pool = c._pools.get(endpoint(port).host_port)
    return [] if pool is None else pool.idle


async def read_all_any(resp: EngineResponse) -> bytes:
    """The body by ``readany()`` until its end."""
    parts = []
    while chunk := await resp.content.readany():
        parts.append(chunk)
    return b"".join(parts)


# --- an aiohttp engine ------------------------------------------------------------------------


@dataclass
class WebEngine:
    port: int = 0
    transports: list[Any] = field(default_factory=list)  # one per TCP connection a request came on
    requests: list[tuple[str, str, bytes]] = field(default_factory=list)  # (method, path, body)

    @property
    def connections(self) -> int:
        return len(self.transports)


@asynccontextmanager
async def web_engine(*routes: tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]
                     ) -> AsyncIterator[WebEngine]:
    eng = WebEngine()

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        t = request.transport
        if not any(t is seen for seen in eng.transports):  # identity: each connection's transport is kept
            eng.transports.append(t)
        eng.requests.append((request.method, request.path, await request.read()))
        return await handler(request)

    app = web.Application(middlewares=[record])
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    eng.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield eng
    finally:
        await runner.cleanup()


# --- a raw engine: exact bytes ----------------------------------------------------------------


@dataclass
class RawEngine:
    port: int = 0
    connections: int = 0
    disconnects: int = 0  # connections on which the server read EOF (or a reset) from the client
    requests: list[bytes] = field(default_factory=list)  # each request's head and body, as received
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)


class RawConn:
    def __init__(self, eng: RawEngine, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.eng, self.reader, self.writer = eng, reader, writer

    async def request(self) -> bytes | None:
        """The next request (head and body), or None at the client's EOF."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            assert exc.partial == b"", exc.partial
            self.eng.disconnects += 1
            return None
        except ConnectionResetError:
            self.eng.disconnects += 1
            return None
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        req = head + await self.reader.readexactly(length)
        self.eng.requests.append(req)
        return req

    async def until_eof(self) -> bytes:
        """Everything the client sends until it closes (or resets) the connection."""
        try:
            data = await self.reader.read()
        except ConnectionResetError:
            data = b""
        self.eng.disconnects += 1
        return data

    def write(self, data: bytes) -> None:
        self.writer.write(data)


@asynccontextmanager
async def raw_engine(serve: Callable[[RawConn], Awaitable[None]]) -> AsyncIterator[RawEngine]:
    """A server running *serve* for each accepted connection (closed when it returns)."""
    eng = RawEngine()

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        eng.tasks.append(task)
        eng.connections += 1
        try:
            await serve(RawConn(eng, reader, writer))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:  # the test is over (asyncio would log a cancelled handler)
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    eng.port = server.sockets[0].getsockname()[1]
    try:
        yield eng
    finally:
        server.close()
        for t in eng.tasks:
            t.cancel()
        await asyncio.gather(*eng.tasks, return_exceptions=True)
        await server.wait_closed()


def answer(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def keep_answering(reply: Callable[[bytes], bytes]) -> Callable[[RawConn], Awaitable[None]]:
    """Serve: answer every request on the connection with reply(request) until the client's EOF."""
    async def serve(conn: RawConn) -> None:
        while (req := await conn.request()) is not None:
            conn.write(reply(req))
    return serve


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)


# --- 1. framing, status, headers --------------------------------------------------------------


PATTERN = bytes(range(256)) * 400  # 100 KiB, every byte value, position-dependent


async def test_content_length_and_chunked_answers_are_read_byte_exact(client: EngineClient) -> None:
    async def sized(_: web.Request) -> web.Response:
        return web.Response(body=PATTERN, status=201, headers={"X-Engine-Tag": "Sized", "Content-Type": "x/y"})

    async def streamed(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"X-Engine-Tag": "Streamed"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i in range(0, len(PATTERN), 7001):  # uneven pieces
            await resp.write(PATTERN[i:i + 7001])
        await resp.write_eof()
        return resp

    async with web_engine(("POST", "/sized", sized), ("POST", "/streamed", streamed)) as eng:
        status, ctype, data = await client.read_all(endpoint(eng.port), "/sized", BODY, "r1")
        assert (status, ctype, data) == (201, "x/y", PATTERN)

        resp = await client.open(endpoint(eng.port), "/sized", BODY, "r2")
        assert resp.status == 201
        assert resp.headers.get("content-length") == str(len(PATTERN))
        assert resp.headers.get("X-ENGINE-TAG") == resp.headers.get("x-engine-tag") == "Sized"
        assert "x-Engine-tag" in resp.headers and "X-Absent" not in resp.headers
        assert resp.headers.get("X-Absent") == "" and resp.headers.get("X-Absent", "d") == "d"
        assert await resp.content.read() == PATTERN
        assert await resp.content.read() == b"" and await resp.content.readany() == b""  # the end, read again
        resp.release()

        resp = await client.open(endpoint(eng.port), "/streamed", BODY, "r3")
        assert resp.status == 200
        assert resp.headers.get("Transfer-Encoding").lower() == "chunked"
        assert "content-length" not in resp.headers
        assert resp.headers.get("x-engine-tag") == "Streamed"
        assert await read_all_any(resp) == PATTERN
        assert await resp.content.readany() == b""  # the end stays the end
        resp.release()
        assert eng.connections == 1  # all three on one keep-alive connection


async def test_an_answer_without_length_ends_with_its_connection(client: EngineClient) -> None:
    async def serve(conn: RawConn) -> None:
        await conn.request()
        conn.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/plain\r\n\r\n")
        for i in range(0, len(PATTERN), 10000):
            conn.write(PATTERN[i:i + 10000])
            await conn.writer.drain()
        # returning closes the connection: the answer's end

    async with raw_engine(serve) as eng:
        resp = await client.open(endpoint(eng.port), "/v1/completions", BODY, "r1")
        assert resp.status == 200 and resp.headers.get("content-type") == "text/plain"
        assert await read_all_any(resp) == PATTERN
        resp.release()
        assert pooled(client, eng.port) == []  # a connection that ended the answer is not reused
        status, _, data = await client.read_all(endpoint(eng.port), "/v1/completions", BODY, "r2")
        assert (status, data) == (200, PATTERN)
        assert eng.connections == 2


async def test_an_answer_with_no_body_keeps_its_connection(client: EngineClient) -> None:
    replies = iter([b"HTTP/1.1 204 No Content\r\nX-A: b\r\n\r\n", answer(b""), answer(b"last")])
    async with raw_engine(keep_answering(lambda _: next(replies))) as eng:
        for status, body in ((204, b""), (200, b""), (200, b"last")):
            assert (await client.read_all(endpoint(eng.port), "/x", BODY, "r"))[::2] == (status, body)
        assert eng.connections == 1


# --- 2. keep-alive ----------------------------------------------------------------------------


async def test_sequential_requests_share_one_connection_and_release_pools_it(client: EngineClient) -> None:
    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"n": len(await request.read())})

    async with web_engine(("POST", "/v1/completions", ok)) as eng:
        for i in range(3):
            resp = await client.open(endpoint(eng.port), "/v1/completions", BODY, f"r{i}")
            assert pooled(client, eng.port) == []  # in use: not offered to another request
            assert orjson.loads(await resp.content.read()) == {"n": len(orjson.dumps(BODY))}
            resp.release()
            assert len(pooled(client, eng.port)) == 1
        assert eng.connections == 1 and len(eng.requests) == 3


async def test_ending_an_answer_again_does_not_touch_the_next_request_on_its_connection(
    client: EngineClient,
) -> None:
    """``close()`` after ``release()`` (aiohttp's ClientResponse allowed it: a no-op once released)
    must not drop the connection a later request now uses."""
    async with raw_engine(keep_answering(lambda _: answer(b"ok"))) as eng:
        first = await client.open(endpoint(eng.port), "/x", BODY, "r1")
        assert await first.content.read() == b"ok"
        first.release()
        second = await client.open(endpoint(eng.port), "/x", BODY, "r2")  # on the same connection
        assert eng.connections == 1
        first.close()
        first.release()
        assert await second.content.read() == b"ok"
        second.release()
        assert len(pooled(client, eng.port)) == 1
        assert (await client.read_all(endpoint(eng.port), "/x", BODY, "r3"))[2] == b"ok"
        assert eng.connections == 1 and eng.disconnects == 0


@pytest.mark.parametrize("head", ["HTTP/1.1 200 OK\r\nConnection: close", "HTTP/1.0 200 OK"])
async def test_an_answer_that_closes_is_not_reused(client: EngineClient, head: str) -> None:
    """``Connection: close`` (or HTTP/1.0 without keep-alive): the next request opens a new
    connection, even while the engine has not closed this one yet."""
    async def serve(conn: RawConn) -> None:
        await conn.request()
        conn.write(head.encode() + b"\r\nContent-Length: 2\r\n\r\nok")
        await conn.until_eof()  # the engine keeps it open: the client must not reuse it

    async with raw_engine(serve) as eng:
        for i in range(2):
            resp = await client.open(endpoint(eng.port), "/x", BODY, f"r{i}")
            assert await resp.content.read() == b"ok"
            resp.release()
            assert pooled(client, eng.port) == []
        assert eng.connections == 2
        await wait_for(lambda: eng.disconnects == 2, timeout=5, what="both connections closed by the client")


async def test_a_connection_idle_past_keepalive_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(engine_http, "time", SimpleNamespace(monotonic=lambda: now[0]))
    c = EngineClient(connect_timeout=2, probe_timeout=2, keepalive=0.2)
    await c.start()
    try:
        async with raw_engine(keep_answering(lambda _: answer(b"ok"))) as eng:
            assert (await c.read_all(endpoint(eng.port), "/x", BODY, "r1"))[2] == b"ok"
            now[0] += 0.1  # within keepalive: reused
            assert (await c.read_all(endpoint(eng.port), "/x", BODY, "r2"))[2] == b"ok"
            assert eng.connections == 1
            now[0] += 0.25  # idle longer than keepalive: dropped, a new one opened
            assert (await c.read_all(endpoint(eng.port), "/x", BODY, "r3"))[2] == b"ok"
            assert eng.connections == 2
            await wait_for(lambda: eng.disconnects == 1, timeout=5, what="the stale connection closed")
            assert len(pooled(c, eng.port)) == 1
    finally:
        await c.close()


async def test_a_connection_the_engine_closed_while_idle_leaves_the_pool(client: EngineClient) -> None:
    async def serve(conn: RawConn) -> None:
        await conn.request()
        conn.write(answer(b"once"))  # keep-alive by its headers, then the engine closes it (idle timeout)

    async with raw_engine(serve) as eng:
        assert (await client.read_all(endpoint(eng.port), "/x", BODY, "r1"))[2] == b"once"
        await wait_for(lambda: pooled(client, eng.port) == [], timeout=5, what="the closed connection forgotten")
        assert (await client.read_all(endpoint(eng.port), "/x", BODY, "r2"))[2] == b"once"
        assert eng.connections == 2


# --- 3./4. leaving early, cancelling ----------------------------------------------------------


class _Leave(Exception):
    pass


@pytest.mark.parametrize("how", ["close", "exception_in_post", "release_before_end"])
async def test_leaving_before_the_end_drops_the_connection(client: EngineClient, how: str) -> None:
    disconnected = asyncio.Event()
    written = [0]

    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        try:
            while True:  # a long generation, until the client goes away
                await resp.write(b"data: token\n\n")
                written[0] += 1
                await asyncio.sleep(0.005)
        except (ConnectionResetError, asyncio.CancelledError):
            disconnected.set()
        return resp

    async def ok(_: web.Request) -> web.Response:
        return web.Response(body=b"fine")

    async with web_engine(("POST", "/stream", endless), ("POST", "/ok", ok)) as eng:
        if how == "exception_in_post":
            with pytest.raises(_Leave):
                async with client.post(endpoint(eng.port), "/stream", BODY, "r1") as resp:
                    assert (await resp.content.readany()).startswith(b"data: token")
                    raise _Leave
        else:
            resp = await client.open(endpoint(eng.port), "/stream", BODY, "r1")
            assert (await resp.content.readany()).startswith(b"data: token")
            if how == "close":
                resp.close()
            else:
                resp.release()
            resp.release()  # a second end is harmless
        assert pooled(client, eng.port) == []
        await asyncio.wait_for(disconnected.wait(), 5)  # the engine saw the disconnect (it would abort)
        status, _, data = await client.read_all(endpoint(eng.port), "/ok", BODY, "r2")
        assert (status, data) == (200, b"fine")
        assert eng.connections == 2


async def test_cancelled_while_waiting_for_the_head(client: EngineClient) -> None:
    got_request = asyncio.Event()

    async def silent(conn: RawConn) -> None:
        await conn.request()
        got_request.set()
        assert await conn.until_eof() == b""  # never answers; sees the client go

    async with raw_engine(silent) as eng:
        task = asyncio.ensure_future(client.open(endpoint(eng.port), "/x", BODY, "r1"))
        await asyncio.wait_for(got_request.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_for(lambda: eng.disconnects == 1, timeout=5, what="the engine saw the disconnect")
        assert pooled(client, eng.port) == []


# --- 5. flow control --------------------------------------------------------------------------


def piece(i: int) -> bytes:
    return i.to_bytes(4, "big") * (65536 // 4)  # 64 KiB, its index in every word


async def test_a_client_that_does_not_read_holds_a_bounded_amount(client: EngineClient) -> None:
    size = 16 * MIB
    count = size // 65536
    sent = [0]
    writers: list[asyncio.StreamWriter] = []

    async def flood(conn: RawConn) -> None:
        await conn.request()
        writers.append(conn.writer)
        conn.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(count):
            conn.write(chunked(piece(i)))
            sent[0] += 65536
            await conn.writer.drain()
        conn.write(b"0\r\n\r\n")

    def engine_blocked() -> bool:
        """The engine's writes wait: the kernel's buffers are full and the client reads nothing."""
        t = writers[0].transport
        return t.get_write_buffer_size() > t.get_write_buffer_limits()[1]

    async with raw_engine(flood) as eng:
        resp = await client.open(endpoint(eng.port), "/x", BODY, "r1")
        body = resp.content
        await wait_for(lambda: body.paused and engine_blocked(), timeout=10,
                       what="the client paused reading and the engine blocked")
        held = body._size
        assert HIGH_WATER < held <= HIGH_WATER + ONE_READ, held
        assert sent[0] < size  # the engine could not send it all: the pause reached it
        data = await read_all_any(resp)
        assert len(data) == size
        assert data == b"".join(piece(i) for i in range(count))
        assert not body.paused
        resp.release()
        assert len(pooled(client, eng.port)) == 1


async def test_an_answer_complete_while_paused_and_released_unread_leaves_a_working_connection(
    client: EngineClient,
) -> None:
    """One byte past HIGH_WATER: reading pauses on the answer's last byte, so the answer is complete
    while paused. Released unread, the connection is reused and must read the next answer."""
    big = bytes(range(256)) * (HIGH_WATER // 256) + b"!"
    replies = iter([answer(big), answer(b"next")])
    async with raw_engine(keep_answering(lambda _: next(replies))) as eng:
        resp = await client.open(endpoint(eng.port), "/x", BODY, "r1")
        await wait_for(lambda: resp.content.paused, timeout=5, what="reading paused")
        resp.release()
        assert len(pooled(client, eng.port)) == 1
        status, _, data = await asyncio.wait_for(client.read_all(endpoint(eng.port), "/x", BODY, "r2"), 5)
        assert (status, data) == (200, b"next")
        assert eng.connections == 1


# --- 6. content codings -----------------------------------------------------------------------


@pytest.mark.parametrize(("coding", "encode"), [
    ("gzip", gzip.compress), ("x-gzip", gzip.compress), ("deflate", zlib.compress), ("GZip", gzip.compress),
])
async def test_compressed_answers_are_decoded(client: EngineClient, coding: str,
                                              encode: Callable[[bytes], bytes]) -> None:
    async def coded(_: web.Request) -> web.Response:
        return web.Response(body=encode(PATTERN), headers={"Content-Encoding": coding})

    async with web_engine(("POST", "/x", coded)) as eng:
        status, _, data = await client.read_all(endpoint(eng.port), "/x", BODY, "r1")
        assert (status, data) == (200, PATTERN)
        resp = await client.open(endpoint(eng.port), "/x", BODY, "r2")
        assert await read_all_any(resp) == PATTERN
        resp.release()
        assert eng.connections == 1


async def test_a_small_body_that_expands_is_read_in_bounded_steps(client: EngineClient) -> None:
    expanded = 16 * MIB
    bomb = zlib.compress(b"\0" * expanded, 9)
    assert len(bomb) < 32 * 1024

    async def coded(_: web.Request) -> web.Response:
        return web.Response(body=bomb, headers={"Content-Encoding": "deflate"})

    async with web_engine(("POST", "/x", coded)) as eng:
        resp = await client.open(endpoint(eng.port), "/x", BODY, "r1")
        total, largest = 0, 0
        while chunk := await resp.content.read(65536):
            assert chunk.count(0) == len(chunk)
            total += len(chunk)
            largest = max(largest, len(chunk))
        assert (total, largest) == (expanded, 65536)
        assert len(await resp.content.readany()) == 0
        resp.release()

        resp = await client.open(endpoint(eng.port), "/x", BODY, "r2")
        small = [len(await resp.content.read(1000)) for _ in range(5)]
        assert small == [1000] * 5
        sizes = []
        while chunk := await resp.content.readany():
            sizes.append(len(chunk))
        assert max(sizes) <= DECODE_STEP and sum(sizes) == expanded - 5000
        resp.release()


async def test_an_unsupported_coding_fails_the_request(client: EngineClient) -> None:
    async def brotli(_: web.Request) -> web.Response:
        return web.Response(body=b"\x1b\x03\x00\xf8\xa5", headers={"Content-Encoding": "br"})

    async def ok(_: web.Request) -> web.Response:
        return web.Response(body=b"fine")

    async with web_engine(("POST", "/br", brotli), ("POST", "/ok", ok)) as eng:
        with pytest.raises(EngineUnreachable, match="content coding") as err:
            await client.open(endpoint(eng.port), "/br", BODY, "r1")
        assert err.value.reached  # the engine got the request and answered it
        assert pooled(client, eng.port) == []
        assert (await client.read_all(endpoint(eng.port), "/ok", BODY, "r2"))[2] == b"fine"
        assert eng.connections == 2


@pytest.mark.parametrize("damage", ["corrupt", "truncated"])
async def test_a_broken_compressed_body_is_a_broken_answer(client: EngineClient, damage: str) -> None:
    good = gzip.compress(PATTERN)
    if damage == "corrupt":
        bad = good[:10] + bytes(b ^ 0x5A for b in good[10:200]) + good[200:]
    else:
        bad = good[: len(good) // 2]

    async def coded(_: web.Request) -> web.Response:
        return web.Response(body=bad, headers={"Content-Encoding": "gzip"})

    async with web_engine(("POST", "/x", coded)) as eng:
        resp = await client.open(endpoint(eng.port), "/x", BODY, "r1")
        assert resp.status == 200
        with pytest.raises(BrokenAnswer, match="compressed answer") as err:
            await resp.content.read()
        assert isinstance(err.value, aiohttp.ClientPayloadError)  # what the dispatcher catches
        with pytest.raises(BrokenAnswer):
            await resp.content.read()  # and the break stays: not a clean end on the next read
        resp.close()
        with pytest.raises(EngineUnreachable) as unreachable:
            await client.read_all(endpoint(eng.port), "/x", BODY, "r2")
        assert unreachable.value.headed and isinstance(unreachable.value.__cause__, BrokenAnswer)


# --- 7. broken answers ------------------------------------------------------------------------


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_an_answer_cut_mid_body_is_a_broken_answer(client: EngineClient, framing: str) -> None:
    sent = PATTERN[:5000]

    async def cut(conn: RawConn) -> None:
        await conn.request()
        if framing == "content-length":
            conn.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(PATTERN), sent))
        else:
            conn.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(sent)
                       + b"1000\r\nabc")

    async with raw_engine(cut) as eng:
        resp = await client.open(endpoint(eng.port), "/x", BODY, "r1")
        got = b""
        with pytest.raises(BrokenAnswer, match="closed the connection before the end") as err:
            while True:
                got += await resp.content.readany()
        assert isinstance(err.value, aiohttp.ClientPayloadError)
        assert got in (sent, sent + b"abc")  # what came before the break is read first
        with pytest.raises(BrokenAnswer):
            await resp.content.read()  # and the break stays
        resp.release()
        assert pooled(client, eng.port) == []

        with pytest.raises(EngineUnreachable) as unreachable:
            await client.read_all(endpoint(eng.port), "/x", BODY, "r2")
        assert unreachable.value.headed


@pytest.mark.parametrize("sent", [b"", b"HTTP/1.1 200 OK\r\nContent-Len", b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
                                  b"HTTP/1.1 abc OK\r\n\r\n"])
async def test_no_valid_head_is_an_unreachable_engine_it_reached(client: EngineClient, sent: bytes) -> None:
    closes = not sent or sent.startswith(b"HTTP/1.1 200")

    async def bad(conn: RawConn) -> None:
        await conn.request()
        conn.write(sent)
        await conn.writer.drain()
        if closes:
            return  # closes before its head or in the middle of it
        await conn.until_eof()  # garbage: the client must close it

    async with raw_engine(bad) as eng:
        with pytest.raises(EngineUnreachable) as err:
            await client.open(endpoint(eng.port), "/x", BODY, "r1")
        assert err.value.reached and not err.value.headed
        assert eng.requests and eng.requests[0].startswith(b"POST /x HTTP/1.1\r\n")
        if not closes:
            await wait_for(lambda: eng.disconnects == 1, timeout=5, what="the client closed the connection")
        assert pooled(client, eng.port) == []


@pytest.mark.parametrize("shape", ["one endless header", "endless interim answers"])
async def test_a_head_past_its_bound_is_cut_off(client: EngineClient, shape: str) -> None:
    """The parser holds a header until its end, so an engine that never ends its head would grow
    the coordinator's memory: past MAX_HEAD_BYTES the connection is dropped and the request fails
    as an engine that was reached."""
    async def endless(conn: RawConn) -> None:
        await conn.request()
        conn.write(b"HTTP/1.1 200 OK\r\nX-Pad: " if shape == "one endless header" else b"")
        piece = b"x" * 4096 if shape == "one endless header" else b"HTTP/1.1 100 Continue\r\n\r\n" * 100
        sent = 0
        while sent <= 4 * engine_http.MAX_HEAD_BYTES:  # the client cuts it off first (a write then fails)
            conn.write(piece)
            await conn.writer.drain()
            sent += len(piece)
        await conn.until_eof()

    async with raw_engine(endless) as eng:
        with pytest.raises(EngineUnreachable, match="head is longer than") as err:
            await client.open(endpoint(eng.port), "/x", BODY, "r1")
        assert err.value.reached
        await wait_for(lambda: eng.tasks[0].done(), timeout=5, what="the engine saw its connection closed")
        assert pooled(client, eng.port) == []


async def test_nothing_listening_is_an_unreachable_engine_never_reached(client: EngineClient) -> None:
    with socket.socket() as bound:  # bound, not listening: connects are refused, the port stays ours
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        with pytest.raises(EngineUnreachable) as err:
            await client.open(endpoint(port), "/x", BODY, "r1")
        assert not err.value.reached
        assert isinstance(err.value.__cause__, ConnectionRefusedError)


async def test_an_upgrade_answer_is_an_unreachable_engine(client: EngineClient) -> None:
    async def upgrade(conn: RawConn) -> None:
        await conn.request()
        conn.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        await conn.until_eof()

    async with raw_engine(upgrade) as eng:
        with pytest.raises(EngineUnreachable, match="HTTP 101") as err:
            await client.open(endpoint(eng.port), "/x", BODY, "r1")
        assert err.value.reached
        await wait_for(lambda: eng.disconnects == 1, timeout=5, what="the client closed the connection")


# --- 8./9. interim answers, redirects ---------------------------------------------------------


@pytest.mark.parametrize("together", [True, False])
async def test_an_interim_answer_is_skipped_for_the_real_one(client: EngineClient, together: bool) -> None:
    interim = [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\n"]
    final = answer(b"the answer", "X-Final: yes")

    async def serve(conn: RawConn) -> None:
        while await conn.request() is not None:
            if together:
                conn.write(b"".join(interim) + final)
            else:
                for part in (*interim, final):
                    conn.write(part)
                    await conn.writer.drain()
                    await asyncio.sleep(0.01)  # separate packets (not a synchronisation)

    async with raw_engine(serve) as eng:
        for i in range(2):
            resp = await client.open(endpoint(eng.port), "/x", BODY, f"r{i}")
            assert resp.status == 200
            assert resp.headers.get("x-final") == "yes" and "link" not in resp.headers
            assert await resp.content.read() == b"the answer"
            resp.release()
        assert eng.connections == 1


async def test_a_redirect_is_refused_and_its_connection_not_pooled(client: EngineClient) -> None:
    async def redirect(_: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect("http://elsewhere.example/steal")

    async def ok(_: web.Request) -> web.Response:
        return web.Response(body=b"fine")

    async with web_engine(("POST", "/redirect", redirect), ("POST", "/ok", ok)) as eng:
        with pytest.raises(EngineUnreachable, match=r"elsewhere\.example") as err:
            await client.open(endpoint(eng.port), "/redirect", BODY, "r1")
        assert not err.value.reached  # the engine did not take it: retried elsewhere
        assert pooled(client, eng.port) == []
        for i in range(2):
            assert (await client.read_all(endpoint(eng.port), "/ok", BODY, f"r{i}"))[::2] == (200, b"fine")
        assert eng.connections == 2
        assert [r[1] for r in eng.requests] == ["/redirect", "/ok", "/ok"]


# --- 10. the request ----------------------------------------------------------------------------


async def test_the_request_bytes(client: EngineClient) -> None:
    async with raw_engine(keep_answering(lambda _: answer(b"ok"))) as eng:
        trace = (("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),)
        await client.read_all(endpoint(eng.port), "/v1/completions", BODY, "req-42", trace=trace)
        resp = await client.open(endpoint(eng.port), "/v1/models", {"ignored": 1}, "req-43", method="GET")
        assert await resp.content.read() == b"ok"
        resp.release()
        assert eng.connections == 1 and len(eng.requests) == 2

        post, get = eng.requests
        head, _, body = post.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        assert lines[0] == "POST /v1/completions HTTP/1.1"
        fields = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        assert fields["host"] == f"127.0.0.1:{eng.port}"
        assert fields["x-request-id"] == "req-42"
        assert fields["content-type"] == "application/json"
        assert fields["traceparent"] == trace[0][1]
        assert body == orjson.dumps(BODY) and fields["content-length"] == str(len(body))

        head, sep, body = get.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        assert lines[0] == "GET /v1/models HTTP/1.1" and sep and body == b""
        names = {line.partition(":")[0].lower() for line in lines[1:]}
        assert "content-length" not in names and "content-type" not in names
        assert "x-request-id: req-43" in (line.lower() for line in lines)


async def test_a_header_with_a_line_break_is_refused_before_sending(client: EngineClient) -> None:
    for headers in ({"X-Request-Id": "a\r\nX-Evil: 1"}, {"X-Request-Id": "a\nb"}, {"X-A\rB": "v"}):
        with pytest.raises(ValueError, match="line break"):
            engine_http.request_bytes("POST", "/x", "127.0.0.1:1", headers, b"{}")

    async with raw_engine(keep_answering(lambda _: answer(b"ok"))) as eng:
        with pytest.raises(ValueError):
            await client.open(endpoint(eng.port), "/x", BODY, "rid\r\nX-Evil: 1")
        with pytest.raises(ValueError):
            await client.open(endpoint(eng.port), "/x", BODY, "rid", trace=(("traceparent", "x\ny"),))
        assert (await client.read_all(endpoint(eng.port), "/x", BODY, "good"))[2] == b"ok"
        assert eng.connections == 1 and len(eng.requests) == 1  # nothing of the refused ones was sent
        assert b"X-Evil" not in eng.requests[0]


# --- 11. cancelling a read ----------------------------------------------------------------------


@pytest.mark.parametrize("coding", ["identity", "gzip"])
async def test_a_cancelled_readany_loses_nothing(client: EngineClient, coding: str) -> None:
    first, second = b"first part " * 100, b"second part " * 100
    go_on = asyncio.Event()
    if coding == "gzip":
        enc = zlib.compressobj(wbits=31)
        wire1 = enc.compress(first) + enc.flush(zlib.Z_SYNC_FLUSH)  # decodable on its own
        wire2 = enc.compress(second) + enc.flush()
    else:
        wire1, wire2 = first, second

    async def two_parts(conn: RawConn) -> None:
        await conn.request()
        conn.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Encoding: %s\r\n\r\n%s"
                   % (coding.encode(), chunked(wire1)))
        await go_on.wait()
        conn.write(chunked(wire2) + b"0\r\n\r\n")
        await conn.until_eof()

    async with raw_engine(two_parts) as eng:
        resp = await client.open(endpoint(eng.port), "/x", BODY, "r1")
        got = b""
        while len(got) < len(first):
            got += await resp.content.readany()
        assert got == first
        reading = asyncio.ensure_future(resp.content.readany())
        await wait_for(lambda: resp.content._waiter is not None, timeout=5, what="the read waits for data")
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
        go_on.set()
        rest = await read_all_any(resp)
        assert got + rest == first + second
        resp.release()
        assert len(pooled(client, eng.port)) == 1


async def test_bytes_that_arrive_as_a_read_is_cancelled_stay_for_the_next_read() -> None:
    """The data and the cancel in the same loop turn: the cancelled read returns nothing, the
    next one returns the data."""
    conn = SimpleNamespace(pause_reading=lambda: None, resume_reading=lambda: None)
    body = engine_http.AnswerBody(conn, None)  # type: ignore[arg-type]
    reading = asyncio.ensure_future(body.readany())
    await wait_for(lambda: body._waiter is not None, timeout=5, what="the read waits for data")
    body.feed(b"arrived")
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    body.feed(b" and more")
    body.feed_eof()
    assert await body.read() == b"arrived and more"


# --- raw deflate, stray bytes, trailers ---------------------------------------------------------


def raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-15)
    return c.compress(data) + c.flush()


async def test_deflate_without_its_zlib_wrapper_is_decoded_too(client: EngineClient) -> None:
    """``deflate`` is sent zlib-wrapped (RFC 9110) or raw by some servers; both decode, as aiohttp's
    client and browsers accept."""
    async def coded(_: web.Request) -> web.Response:
        return web.Response(body=raw_deflate(PATTERN), headers={"Content-Encoding": "deflate"})

    async with web_engine(("POST", "/x", coded)) as eng:
        assert await client.read_all(endpoint(eng.port), "/x", BODY, "r1") == (200, "application/octet-stream",
                                                                                 PATTERN)


async def test_bytes_after_an_answer_keep_the_connection_out_of_the_pool(client: EngineClient) -> None:
    """An engine that sends more than its answer (here the start of another answer in the same
    packet, then bytes while the connection is idle) cannot have its next answer told from them:
    the answer it sent is read as it was, and the connection is not used again."""
    served = 0
    idle = asyncio.Event()  # set by the test once the second answer's connection is in the pool

    async def serve(conn: RawConn) -> None:
        nonlocal served
        while await conn.request() is not None:
            served += 1
            if served == 1:  # an answer and the head of one nobody asked for, in one write
                conn.write(answer(b"first", "Content-Type: text/plain") + b"HTTP/1.1 200 OK\r\nX-Stray: 1\r\n")
            elif served == 2:
                conn.write(answer(b"second"))
                await idle.wait()
                conn.write(b"HTTP/1.1 200 OK\r\n")  # while the connection is idle in the pool
            else:
                conn.write(answer(b"third"))

    async with raw_engine(serve) as eng:
        resp = await client.open(endpoint(eng.port), "/x", BODY, "r1")
        assert await resp.content.read() == b"first"
        assert resp.headers.get("Content-Type") == "text/plain" and "X-Stray" not in resp.headers
        resp.release()
        assert pooled(client, eng.port) == []  # not reused: the stray head would be read as the next answer
        assert (await client.read_all(endpoint(eng.port), "/x", BODY, "r2"))[2] == b"second"
        assert len(pooled(client, eng.port)) == 1  # a clean answer: pooled, until the engine sends more
        idle.set()
        await wait_for(lambda: pooled(client, eng.port) == [], timeout=5, what="the connection dropped")
        assert (await client.read_all(endpoint(eng.port), "/x", BODY, "r3"))[2] == b"third"
        assert eng.connections == 3


async def test_a_chunked_answers_trailer_does_not_change_its_headers(client: EngineClient) -> None:
    async def serve(conn: RawConn) -> None:
        await conn.request()
        conn.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                   + chunked(b"data: 1\n\n") + b"0\r\nContent-Type: text/html\r\n\r\n")
        await conn.until_eof()

    async with raw_engine(serve) as eng:
        resp = await client.open(endpoint(eng.port), "/x", BODY, "r1")
        assert await resp.content.read() == b"data: 1\n\n"
        assert resp.headers.get("Content-Type") == "text/event-stream"
        resp.release()
        assert len(pooled(client, eng.port)) == 1  # a trailer is part of a valid answer: reused
