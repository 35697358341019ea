"""The bare cost of the gateway -> coordinator hop, without Motor (not a test).

    .venv/bin/python bench/grpc_hop.py [--requests 3000] [--concurrency 1,64] [--rounds 2]
                                       [--stacks grpcio,grpclib] [--spread 0]
    .venv/bin/pip install grpclib        # the grpclib stack only: a candidate, not a dependency

One server process answers each request with two messages (a head, then a ~300-byte answer);
the client sends requests either as one unary-stream call each (what ``Dispatch`` is; grpcio
only) or as messages on one long-lived bidirectional stream, tagged with an id and batched when
several wait (what ``DispatchMany`` does). Prints requests/s, CPU microseconds per request in the
client and in the server process, and for the stream the mean number of requests per message the
client sent.

Stacks: ``grpcio`` (grpc.aio: the C core, its completion-queue poller thread handing events to
the event loop; what Motor uses) and ``grpclib`` (pure Python on asyncio, HTTP/2 by the ``h2``
package, no threads), both on uvloop, both speaking the same wire protocol.

``--spread MS``: the server answers each request after a uniformly random 0..MS milliseconds (as
engines of varying speed do), so answers and the next requests arrive spread out and a message
carries what arrived meanwhile. Without it every answer of a burst goes back in one message and
the next burst of 64 requests in one message: the best case for batching, which Motor under
load does not see.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import psutil

BODY = (b'{"model":"bench","prompt":"request 1: summarise the state of the fleet and the queue depth of '
        b'every prefill engine in one sentence","max_tokens":16,"temperature":0,"stream":false}')
ANSWER = b'{"id":"cmpl-x","object":"text_completion","choices":[{"text":"' + b"x" * 200 + b'"}]}'
STACKS = ("grpcio", "grpclib")
MAX_BATCH = 256


def ident(b: bytes) -> bytes:
    return b


def pack(items: list[bytes]) -> bytes:
    return b"".join(struct.pack(">I", len(i)) + i for i in items)


def unpack(data: bytes) -> list[bytes]:
    out, i = [], 0
    while i < len(data):
        (n,) = struct.unpack_from(">I", data, i)
        out.append(data[i + 4:i + 4 + n])
        i += 4 + n
    return out


def _answerer(out: asyncio.Queue[bytes], spread_ms: float) -> Callable[[bytes], None]:
    """What the server does with one request: its two answer messages go into *out*, at once or
    after a random 0..spread_ms delay."""
    loop = asyncio.get_running_loop()

    def answer(item: bytes) -> None:
        out.put_nowait(item[:8] + b"H")
        out.put_nowait(item[:8] + b"C" + ANSWER)

    def on(item: bytes) -> None:
        if spread_ms > 0:
            loop.call_later(random.uniform(0, spread_ms) / 1000, answer, item)
        else:
            answer(item)
    return on


async def next_batch(out: asyncio.Queue[bytes]) -> bytes:
    """The next message: every item waiting, at most MAX_BATCH."""
    batch = [await out.get()]
    while not out.empty() and len(batch) < MAX_BATCH:
        batch.append(out.get_nowait())
    return pack(batch)


async def relay_stream(requests: AsyncIterator[bytes], send: Callable[[bytes], Awaitable[Any]],
                       take: Callable[[bytes], None], out: asyncio.Queue[bytes]) -> None:
    """The server side of one bidirectional stream, on either stack: each item of each message of
    *requests* goes to *take*; what is put into *out* goes back through *send*, batched."""
    async def read() -> None:
        async for msg in requests:
            for item in unpack(msg):
                take(item)

    reader = asyncio.ensure_future(read())
    try:
        while True:
            await send(await next_batch(out))
    finally:
        reader.cancel()


async def _serve_grpcio(port: int, spread_ms: float) -> None:
    async def unary(req: bytes, ctx: Any) -> Any:
        yield b"H" + req[:8]
        yield b"C" + ANSWER

    async def bidi(requests: Any, ctx: Any) -> None:
        out: asyncio.Queue[bytes] = asyncio.Queue()
        await relay_stream(requests, ctx.write, _answerer(out, spread_ms), out)

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("hop.S", {
        "U": grpc.unary_stream_rpc_method_handler(unary, ident, ident),
        "B": grpc.stream_stream_rpc_method_handler(bidi, ident, ident),
    }),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def raw_codec() -> Any:
    """grpclib's codec for messages that are bytes already (what ``ident`` is for grpcio)."""
    from grpclib.encoding.base import CodecBase

    class Raw(CodecBase):  # type: ignore[misc]
        __content_subtype__ = "proto"

        def encode(self, message: Any, message_type: Any) -> bytes:
            return message  # type: ignore[no-any-return]

        def decode(self, data: bytes, message_type: Any) -> Any:
            return data

    return Raw()


async def _serve_grpclib(port: int, spread_ms: float) -> None:
    from grpclib.const import Cardinality, Handler
    from grpclib.server import Server

    class Hop:
        async def bidi(self, stream: Any) -> None:
            out: asyncio.Queue[bytes] = asyncio.Queue()
            await relay_stream(stream, stream.send_message, _answerer(out, spread_ms), out)

        def __mapping__(self) -> dict[str, Any]:
            return {"/hop.S/B": Handler(self.bidi, Cardinality.STREAM_STREAM, bytes, bytes)}

    server = Server([Hop()], codec=raw_codec())
    await server.start("127.0.0.1", port)
    await server.wait_closed()


async def _open_stream(stack: str, port: int) -> tuple[Any, Any, Any, Any]:
    """(send, recv, end-of-stream marker, close) of one bidirectional call on *stack*."""
    if stack == "grpcio":
        ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        await ch.channel_ready()
        call = ch.stream_stream("/hop.S/B", ident, ident)()
        return call.write, call.read, grpc.aio.EOF, ch.close
    from grpclib.client import Channel
    from grpclib.const import Cardinality

    channel = Channel("127.0.0.1", port, codec=raw_codec())
    stream = await channel.request("/hop.S/B", Cardinality.STREAM_STREAM, bytes, bytes).__aenter__()
    await stream.send_request()

    async def close() -> None:
        channel.close()
    return stream.send_message, stream.recv_message, None, close


async def _client(stack: str, port: int, server_pid: int, mode: str, concurrency: int, n: int) -> str:
    waiters: dict[bytes, asyncio.Future[None]] = {}
    outbox: asyncio.Queue[bytes] = asyncio.Queue()
    sizes: list[int] = []
    tasks: list[asyncio.Future[Any]] = []
    close: Any = None
    unary: Any = None
    if mode == "unary":
        ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        await ch.channel_ready()
        unary, close = ch.unary_stream("/hop.S/U", ident, ident), ch.close
    else:
        send, recv, eof, close = await _open_stream(stack, port)

        async def reader() -> None:
            try:
                while (msg := await recv()) is not eof:
                    for item in unpack(msg):
                        if item[8:9] == b"C":
                            waiters.pop(item[:8]).set_result(None)
            except Exception:  # the stream closed under it at the end
                pass

        async def writer() -> None:
            while True:
                batch = [await outbox.get()]
                while not outbox.empty() and len(batch) < MAX_BATCH:
                    batch.append(outbox.get_nowait())
                sizes.append(len(batch))
                await send(pack(batch))

        tasks = [asyncio.ensure_future(reader()), asyncio.ensure_future(writer())]
    seq = [0]

    async def one() -> None:
        if mode == "unary":
            async for _ in unary(BODY, timeout=10, metadata=(("x-request-id", "r"),)):
                pass
            return
        seq[0] += 1
        sid = struct.pack(">Q", seq[0])
        fut = asyncio.get_running_loop().create_future()
        waiters[sid] = fut
        outbox.put_nowait(sid + BODY)
        await fut

    async def worker(k: int) -> None:
        for _ in range(k):
            await one()

    for _ in range(50):
        await one()
    sizes.clear()
    srv = psutil.Process(server_pid)
    s0, c0, t0 = srv.cpu_times(), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    await asyncio.gather(*(worker(n // concurrency) for _ in range(concurrency)))
    t, c1, s1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF), srv.cpu_times()
    client_us = (c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime) / n * 1e6
    server_us = (s1.user + s1.system - s0.user - s0.system) / n * 1e6
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await close()
    batch = f"  {sum(sizes) / len(sizes):5.1f} requests/message" if sizes else ""
    return (f"{stack:7} {mode:6} c={concurrency:<3} {n / t:7.0f} req/s  CPU/request: client {client_us:5.0f} us, "
            f"server {server_us:5.0f} us, total {client_us + server_us:5.0f} us{batch}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", default="1,64")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--stacks", default="grpcio", help=f"comma-separated, of {', '.join(STACKS)}")
    ap.add_argument("--spread", type=float, default=0.0, help="answer after a random 0..SPREAD ms")
    ap.add_argument("--serve", choices=STACKS, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    import uvloop

    if args.serve:
        uvloop.run((_serve_grpcio if args.serve == "grpcio" else _serve_grpclib)(args.port, args.spread))
        return
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    from motor_common.ports import free_port

    stacks = [s for s in args.stacks.split(",") if s]
    if unknown := [s for s in stacks if s not in STACKS]:
        ap.error(f"unknown stack {unknown[0]!r}: one of {', '.join(STACKS)}")
    if "grpclib" in stacks:
        try:
            import grpclib  # noqa: F401
        except ImportError:
            ap.error("the grpclib stack needs grpclib: .venv/bin/pip install grpclib")
    for _ in range(args.rounds):
        for stack in stacks:
            port = free_port()
            server = subprocess.Popen([sys.executable, __file__, "--serve", stack, "--port", str(port),
                                       "--spread", str(args.spread)])
            try:
                for mode in ("unary", "stream") if stack == "grpcio" else ("stream",):
                    for c in (int(x) for x in args.concurrency.split(",")):
                        print(uvloop.run(_connected(stack, port, server, mode, c, args.requests)), flush=True)
            finally:
                server.terminate()
                server.wait(10)


async def _connected(stack: str, port: int, server: subprocess.Popen[bytes], mode: str, c: int, n: int) -> str:
    """:func:`_client` once the server listens (it was just started)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the {stack} hop server did not start") from None
            await asyncio.sleep(0.05)
    return await _client(stack, port, server.pid, mode, c, n)


if __name__ == "__main__":
    main()
