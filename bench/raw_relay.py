"""The co-located front's hot path on bare asyncio protocols: the floor of a Python data plane (not a
test, not shipped).

    .venv/bin/pip install httptools     # llhttp's C parser (MagicStack; uvicorn's); not a dependency
    .venv/bin/python bench/raw_relay.py --port P --prefill URL --decode URL

What ``bench/http_stack.py`` measures as stack ``raw``: the same relay as its ``aiohttp`` stack
(``POST /v1/completions``: orjson parse, the vLLM prefill leg with ``max_tokens`` 1 and
``do_remote_decode``, the decode leg with the returned ``kv_transfer_params``, the decode answer
relayed whole or chunk by chunk) with no HTTP framework on either side: an ``asyncio.Protocol`` per
connection, httptools parsing requests and answers, requests and answer heads written as prepared
bytes, keep-alive connections to the engines in a per-engine pool, a coroutine per request. No
admission, limits, metrics, timeouts or error mapping beyond "the engine answered, relay it": it
answers the question issue 17 left open, how much of the front's CPU per request is the HTTP
framework (aiohttp's objects, its client's connector and session) and how much is Python itself.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import httptools
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PATH = b"/v1/completions"
_KV = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
       "remote_block_ids": None, "remote_host": None, "remote_port": None}
_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 500: b"Internal Server Error",
            502: b"Bad Gateway", 503: b"Service Unavailable"}


class _Answer:
    """One engine answer as it arrives: status and content type once the head is in; body chunks
    queued (``None`` ends the body)."""

    __slots__ = ("chunks", "ctype", "head", "status", "wake")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.head: asyncio.Future[None] = loop.create_future()
        self.status = 0
        self.ctype = b"application/json"
        self.chunks: deque[bytes | None] = deque()
        self.wake: asyncio.Future[None] | None = None

    def push(self, chunk: bytes | None) -> None:
        self.chunks.append(chunk)
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)

    async def next(self) -> bytes | None:
        while not self.chunks:
            self.wake = asyncio.get_running_loop().create_future()
            await self.wake
        return self.chunks.popleft()

    async def whole(self) -> bytes:
        parts = []
        while (chunk := await self.next()) is not None:
            parts.append(chunk)
        return b"".join(parts)


class _EngineConn(asyncio.Protocol):
    """A keep-alive HTTP/1.1 connection to one engine, one request at a time."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.answer: _Answer | None = None
        self._ctype_next = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.pool.forget(self)
        a, self.answer = self.answer, None
        if a is not None:
            if not a.head.done():
                a.head.set_exception(ConnectionError(f"engine closed the connection: {exc}"))
            a.push(None)

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if self.answer is not None and name.lower() == b"content-type":
            self.answer.ctype = value

    def on_headers_complete(self) -> None:
        a = self.answer
        if a is not None:
            a.status = self.parser.get_status_code()
            a.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.answer is not None:
            self.answer.push(body)

    def on_message_complete(self) -> None:
        a, self.answer = self.answer, None
        keep = self.parser.should_keep_alive()
        if a is not None:
            a.push(None)
        if keep:
            self.pool.release(self)
        elif self.transport is not None:
            self.transport.close()

    def send(self, request: bytes, answer: _Answer) -> None:
        self.answer = answer
        assert self.transport is not None
        self.transport.write(request)


class _Pool:
    """Idle keep-alive connections to one engine."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"engine URL needs a host and a port: {url!r}")
        self.host, self.port = parts.hostname, parts.port
        self.host_header = f"{self.host}:{self.port}".encode()
        self.idle: list[_EngineConn] = []

    async def post(self, body: bytes, rid: bytes) -> _Answer:
        conn = self.idle.pop() if self.idle else None
        if conn is None:
            loop = asyncio.get_running_loop()
            _, conn = await loop.create_connection(lambda: _EngineConn(self), self.host, self.port)
        answer = _Answer(asyncio.get_running_loop())
        conn.send(b"POST /v1/completions HTTP/1.1\r\nHost: " + self.host_header
                  + b"\r\nContent-Type: application/json\r\nX-Request-Id: " + rid
                  + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body, answer)
        await answer.head
        return answer

    def release(self, conn: _EngineConn) -> None:
        self.idle.append(conn)

    def forget(self, conn: _EngineConn) -> None:
        if conn in self.idle:
            self.idle.remove(conn)


class _Front(asyncio.Protocol):
    """One client connection to the relay: requests parsed by httptools, each handled by a
    coroutine; answers written in order (a client that pipelines waits for the previous answer)."""

    def __init__(self, relay: RawRelay) -> None:
        self.relay = relay
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.busy: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._write_whole(400, b"application/json", b'{"error":"bad request"}', keep=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        raw, url, keep = b"".join(self.body), self.url, self.parser.should_keep_alive()
        self.body, self.url = [], b""
        prev = self.busy
        self.busy = asyncio.get_running_loop().create_task(self._handle(prev, url, raw, keep))

    async def _handle(self, prev: asyncio.Task[None] | None, url: bytes, raw: bytes, keep: bool) -> None:
        if prev is not None and not prev.done():
            await prev
        if url != PATH or self.parser.get_method() != b"POST":
            self._write_whole(404, b"application/json", b'{"error":"not found"}', keep)
            return
        try:
            await self.relay.relay(self, raw, keep)
        except Exception as exc:
            self._write_whole(502, b"application/json", orjson.dumps({"error": str(exc)}), keep=False)

    async def stream(self, status: int, ctype: bytes, keep: bool,
                     next_chunk: Callable[[], Awaitable[bytes | None]]) -> None:
        """A streamed answer, chunk by chunk as *next_chunk* gives them (None: the end); the head
        goes with the first chunk. A client that left: the rest is drained (the engine's
        connection stays reusable)."""
        head = (b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                b"%s\r\n" % (status, _REASONS.get(status, b"Other"), ctype, b"" if keep else b"Connection: close\r\n"))
        while (chunk := await next_chunk()) is not None:
            if self.transport is not None:
                self.transport.write(head + b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                head = b""
        if self.transport is not None:
            self.transport.write(head + b"0\r\n\r\n")
            if not keep:
                self.transport.close()

    def _write_whole(self, status: int, ctype: bytes, body: bytes, keep: bool) -> None:
        t = self.transport
        if t is None:
            return
        t.write(b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n"
                % (status, _REASONS.get(status, b"Other"), ctype, len(body),
                   b"" if keep else b"Connection: close\r\n") + body)
        if not keep:
            t.close()


class RawRelay:
    def __init__(self, prefill: str, decode: str) -> None:
        self.prefill = _Pool(prefill)
        self.decode = _Pool(decode)

    async def _legs(self, raw: bytes) -> tuple[_Answer, bytes | None]:
        """The prefill leg, then the decode leg: (the answer to relay, its whole body when it is
        the prefill's failure, else None)."""
        rid = uuid.uuid4().hex.encode()
        body: dict[str, Any] = orjson.loads(raw)
        pbody = dict(body, stream=False, max_tokens=1, kv_transfer_params=_KV)
        pbody.pop("stream_options", None)
        pa = await self.prefill.post(orjson.dumps(pbody), rid)
        pdata = await pa.whole()
        if pa.status != 200:
            return pa, pdata
        kv = orjson.loads(pdata).get("kv_transfer_params")
        return await self.decode.post(orjson.dumps(dict(body, kv_transfer_params=kv)), rid), None

    async def relay(self, front: _Front, raw: bytes, keep: bool) -> None:
        a, data = await self._legs(raw)
        if data is None and a.ctype.startswith(b"text/event-stream"):
            await front.stream(a.status, a.ctype, keep, a.next)
        else:
            front._write_whole(a.status, a.ctype, await a.whole() if data is None else data, keep)

    async def open(self, raw: bytes) -> tuple[int, str, AsyncIterator[bytes]]:
        """http_stack's relay interface (status, content type, chunks): the raw engine client
        behind another server (stack ``aiohttp+raw``)."""
        a, data = await self._legs(raw)
        return a.status, a.ctype.decode(), _drain(a) if data is None else _one(data)

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _drain(a: _Answer) -> AsyncIterator[bytes]:
    while (chunk := await a.next()) is not None:
        yield chunk


class GenericRelay:
    """The raw server in front of any relay with http_stack's ``open()`` (stack ``raw+aiohttp``:
    aiohttp's client)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def relay(self, front: _Front, raw: bytes, keep: bool) -> None:
        status, ctype, chunks = await self.inner.open(raw)
        if not ctype.startswith("text/event-stream"):
            front._write_whole(status, ctype.encode(), b"".join([c async for c in chunks]), keep)
            return
        await front.stream(status, ctype.encode(), keep, lambda: anext(chunks, None))


async def serve(port: int, prefill: str, decode: str, client: str = "raw") -> None:
    relay: Any
    if client == "raw":
        relay = RawRelay(prefill, decode)
    else:
        from bench.http_stack import make_relay

        relay = GenericRelay(make_relay(client, prefill, decode))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Front(relay), "127.0.0.1", port, reuse_address=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--prefill", required=True)
    ap.add_argument("--decode", required=True)
    ap.add_argument("--client", default="raw", help="raw (default), or an http_stack engine client: aiohttp, ...")
    a = ap.parse_args()
    import uvloop

    uvloop.run(serve(a.port, a.prefill, a.decode, a.client))


if __name__ == "__main__":
    main()
