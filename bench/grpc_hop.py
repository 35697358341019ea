"""The bare cost of the gateway -> coordinator hop in grpc.aio, without Motor (not a test).

    .venv/bin/python bench/grpc_hop.py [--requests 3000] [--concurrency 1,64]

One server process answers each request with two messages (a head, then a ~300-byte answer);
the client sends requests either as one unary-stream call each (what ``Dispatch`` is) or as
messages on one long-lived bidirectional stream, tagged with an id and batched when several
wait (what ``DispatchMany`` does). Prints requests/s and CPU microseconds per request in the
client and in the server process.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import struct
import subprocess
import sys
import time
from typing import Any

import grpc
import psutil

BODY = (b'{"model":"bench","prompt":"request 1: summarise the state of the fleet and the queue depth of '
        b'every prefill engine in one sentence","max_tokens":16,"temperature":0,"stream":false}')
ANSWER = b'{"id":"cmpl-x","object":"text_completion","choices":[{"text":"' + b"x" * 200 + b'"}]}'


def _ident(b: bytes) -> bytes:
    return b


def _pack(items: list[bytes]) -> bytes:
    return b"".join(struct.pack(">I", len(i)) + i for i in items)


def _unpack(data: bytes) -> list[bytes]:
    out, i = [], 0
    while i < len(data):
        (n,) = struct.unpack_from(">I", data, i)
        out.append(data[i + 4:i + 4 + n])
        i += 4 + n
    return out


async def _serve(port: int) -> None:
    async def unary(req: bytes, ctx: Any) -> Any:
        yield b"H" + req[:8]
        yield b"C" + ANSWER

    async def bidi(requests: Any, ctx: Any) -> Any:
        out: asyncio.Queue[bytes] = asyncio.Queue()

        async def read() -> None:
            async for msg in requests:
                for item in _unpack(msg):
                    out.put_nowait(item[:8] + b"H")
                    out.put_nowait(item[:8] + b"C" + ANSWER)

        reader = asyncio.ensure_future(read())
        try:
            while True:
                batch = [await out.get()]
                while not out.empty() and len(batch) < 256:
                    batch.append(out.get_nowait())
                yield _pack(batch)
        finally:
            reader.cancel()

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("hop.S", {
        "U": grpc.unary_stream_rpc_method_handler(unary, _ident, _ident),
        "B": grpc.stream_stream_rpc_method_handler(bidi, _ident, _ident),
    }),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


async def _client(port: int, server_pid: int, mode: str, concurrency: int, n: int) -> str:
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    await ch.channel_ready()
    unary = ch.unary_stream("/hop.S/U", _ident, _ident)
    waiters: dict[bytes, asyncio.Future[None]] = {}
    outbox: asyncio.Queue[bytes] = asyncio.Queue()
    tasks = []
    if mode == "stream":
        call = ch.stream_stream("/hop.S/B", _ident, _ident)()

        async def reader() -> None:
            while (msg := await call.read()) is not grpc.aio.EOF:
                for item in _unpack(msg):
                    if item[8:9] == b"C":
                        waiters.pop(item[:8]).set_result(None)

        async def writer() -> None:
            while True:
                batch = [await outbox.get()]
                while not outbox.empty() and len(batch) < 256:
                    batch.append(outbox.get_nowait())
                await call.write(_pack(batch))

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
    srv = psutil.Process(server_pid)
    s0, c0, t0 = srv.cpu_times(), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    await asyncio.gather(*(worker(n // concurrency) for _ in range(concurrency)))
    t, c1, s1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF), srv.cpu_times()
    client_us = (c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime) / n * 1e6
    server_us = (s1.user + s1.system - s0.user - s0.system) / n * 1e6
    for task in tasks:
        task.cancel()
    await ch.close()
    return (f"{mode:6} c={concurrency:<3} {n / t:7.0f} req/s  CPU/request: client {client_us:5.0f} us, "
            f"server {server_us:5.0f} us, total {client_us + server_us:5.0f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", default="1,64")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    import uvloop

    if args.serve:
        uvloop.run(_serve(args.serve))
        return
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    from motor_common.ports import free_port

    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    try:
        for _ in range(args.rounds):
            for mode in ("unary", "stream"):
                for c in (int(x) for x in args.concurrency.split(",")):
                    print(uvloop.run(_client(port, server.pid, mode, c, args.requests)), flush=True)
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
