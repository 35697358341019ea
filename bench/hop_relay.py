"""The gateway topology's floor: an HTTP front and a dispatcher in two processes, one gRPC stream
between them, and nothing of Motor's own per-request work (not a test, not shipped).

    .venv/bin/python bench/hop_relay.py back --port P --prefill URL --decode URL [--transport grpclib]
    .venv/bin/python bench/hop_relay.py front --port F --back 127.0.0.1:P [--transport grpclib]

What ``bench/http_stack.py`` measures as stack ``hop``: ``front`` is ``aiohttp.web`` taking
``POST /v1/completions`` and sending each body to ``back`` on one long-lived grpc.aio
bidirectional stream (an id per request; every request waiting when the stream can take a
message goes in one message, as ``DispatchMany`` does); ``back`` runs the two engine legs with the
coordinator's own ``EngineClient`` (``bench/http_stack.py``'s ``engine`` client: the vLLM prefill,
then the decode with the returned ``kv_transfer_params``) and sends the answer back on the stream,
whole (non-streamed) or a message per chunk the engine's reads return (streamed), answers waiting
together in one message. So it has the shape of ``motor up``'s gateway + coordinator, with their
transports (aiohttp's server, grpc.aio, ``engine_http``) and without Motor's work around them:
no admission, limits, validation, request ids, access log, metrics, scheduling, watchdogs,
retries or flow control. Its CPU per request (both processes) against Motor's tells how much of
the default topology is the transports and how much Motor's per-request machinery.
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.grpc_hop import ident, next_batch, raw_codec, relay_stream, unpack

PATH = "/v1/completions"
_METHOD = "/hop.Relay/Many"
# item kinds, back -> front: the head (status and content type), a body chunk, the end
_HEAD, _CHUNK, _END = b"H", b"C", b"E"


# --- back: the dispatcher's side ----------------------------------------------------------------
async def serve_back(port: int, prefill: str, decode: str, transport: str = "grpcio") -> None:
    from bench.http_stack import make_relay

    relay = make_relay("engine", prefill, decode)
    await relay.start()

    async def many(requests: AsyncIterator[bytes], send: Callable[[bytes], Awaitable[Any]]) -> None:
        """One stream: each request's engine legs in a task of their own, the answers back as they come."""
        out: asyncio.Queue[bytes] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def one(sid: bytes, raw: bytes) -> None:
            status, ctype, chunks = await relay.open(raw)
            out.put_nowait(sid + _HEAD + struct.pack(">H", status) + ctype.encode())
            if ctype.startswith("text/event-stream"):
                async for chunk in chunks:
                    out.put_nowait(sid + _CHUNK + chunk)
            else:
                out.put_nowait(sid + _CHUNK + b"".join([c async for c in chunks]))
            out.put_nowait(sid + _END)

        def take(item: bytes) -> None:
            task = asyncio.ensure_future(one(item[:8], item[8:]))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        try:
            await relay_stream(requests, send, take, out)
        finally:
            for task in list(tasks):
                task.cancel()

    if transport == "grpcio":
        async def handler(requests: Any, ctx: Any) -> None:
            await many(requests, ctx.write)

        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("hop.Relay", {
            "Many": grpc.stream_stream_rpc_method_handler(handler, ident, ident)}),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()
        return
    from grpclib.const import Cardinality, Handler
    from grpclib.server import Server

    class Relay:
        async def many(self, stream: Any) -> None:
            await many(stream, stream.send_message)

        def __mapping__(self) -> dict[str, Any]:
            return {_METHOD: Handler(self.many, Cardinality.STREAM_STREAM, bytes, bytes)}

    grpclib_server = Server([Relay()], codec=raw_codec())
    await grpclib_server.start("127.0.0.1", port)
    await grpclib_server.wait_closed()


# --- front: the gateway's side ------------------------------------------------------------------
class Stream:
    """The front's one stream to ``back``: requests out, their items routed back by id. A relay
    for ``bench/http_stack.py``'s ``aiohttp_app`` (``open`` -> status, content type, chunks)."""

    def __init__(self, back: str) -> None:
        self.back = back
        self.channel: Any = None  # opened in the event loop, at the first request
        self.call: Any = None
        self.outbox: asyncio.Queue[bytes] = asyncio.Queue()
        self.waiting: dict[bytes, asyncio.Queue[bytes]] = {}
        self.seq = 0
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        pass  # the stream opens at the first request, in the event loop

    async def open(self, raw: bytes) -> tuple[int, str, AsyncIterator[bytes]]:
        items = self._send_request(raw)
        head = await items.get()
        return struct.unpack(">H", head[1:3])[0], head[3:].decode(), self._chunks(items)

    @staticmethod
    async def _chunks(items: asyncio.Queue[bytes]) -> AsyncIterator[bytes]:
        while (item := await items.get())[:1] != _END:
            yield item[1:]

    def _send_request(self, raw: bytes) -> asyncio.Queue[bytes]:
        if self.call is None:
            self.channel = grpc.aio.insecure_channel(self.back)
            self.call = self.channel.stream_stream(_METHOD, ident, ident)()
            self._send, self._recv, self._eof = self.call.write, self.call.read, grpc.aio.EOF
            self.tasks = [asyncio.ensure_future(self._write()), asyncio.ensure_future(self._read())]
        self.seq += 1
        sid = struct.pack(">Q", self.seq)
        items: asyncio.Queue[bytes] = asyncio.Queue()
        self.waiting[sid] = items
        self.outbox.put_nowait(sid + raw)
        return items

    async def _write(self) -> None:
        while True:
            await self._send(await next_batch(self.outbox))

    async def _read(self) -> None:
        while (msg := await self._recv()) is not self._eof:
            for item in unpack(msg):
                sid = item[:8]
                q = self.waiting.pop(sid) if item[8:9] == _END else self.waiting.get(sid)
                if q is not None:
                    q.put_nowait(item[8:])

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.channel is not None:
            await self.channel.close()


class GrpclibStream(Stream):
    """:class:`Stream` on grpclib instead of grpc.aio."""

    def _send_request(self, raw: bytes) -> asyncio.Queue[bytes]:
        if self.call is None:
            from grpclib.client import Channel

            host, _, port = self.back.rpartition(":")
            self.channel = Channel(host, int(port), codec=raw_codec())
            self.call = True
            self.tasks = [asyncio.ensure_future(self._run())]
        return super()._send_request(raw)

    async def _run(self) -> None:
        from grpclib.const import Cardinality

        async with self.channel.request(_METHOD, Cardinality.STREAM_STREAM, bytes, bytes) as stream:
            await stream.send_request()
            self._send, self._recv, self._eof = stream.send_message, stream.recv_message, None
            await asyncio.gather(self._write(), self._read())

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.channel is not None:
            self.channel.close()


def front_app(back: str, transport: str = "grpcio") -> Any:
    from bench.http_stack import aiohttp_app

    return aiohttp_app(Stream(back) if transport == "grpcio" else GrpclibStream(back))  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = ap.add_subparsers(dest="side", required=True)
    b = sub.add_parser("back", help="the dispatcher's side: the engine legs")
    b.add_argument("--port", type=int, required=True)
    b.add_argument("--prefill", required=True)
    b.add_argument("--decode", required=True)
    f = sub.add_parser("front", help="the gateway's side: aiohttp.web")
    f.add_argument("--port", type=int, required=True)
    f.add_argument("--back", required=True, help="host:port of the back process")
    for p in (b, f):
        p.add_argument("--transport", choices=["grpcio", "grpclib"], default="grpcio",
                       help="the stream's gRPC library (grpclib: pip install grpclib; not a dependency)")
    a = ap.parse_args()
    from motor_common.runner import install_uvloop

    install_uvloop()
    if a.side == "back":
        asyncio.run(serve_back(a.port, a.prefill, a.decode, a.transport))
    else:
        from aiohttp import web

        web.run_app(front_app(a.back, a.transport), host="127.0.0.1", port=a.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
