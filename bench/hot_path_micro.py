"""Per-request Python costs of the hot path, in process (not a test): what the 2026-12-01 cuts
remove, each against its replacement, on uvloop.

    .venv/bin/python bench/hot_path_micro.py

* the first-byte watchdog: a task + ``asyncio.wait`` per engine attempt vs a timer in the
  caller's task (``Dispatcher._watch``);
* the gateway's first frame: a read task, a route-watcher task and ``asyncio.wait`` vs a plain
  await (``failover._first_frame`` with one coordinator);
* ``Counter.labels(...).inc()`` vs a cached child (``request_metrics``);
* the pass-through span the front made per request with tracing off vs a header check;
* a frame already queued for the gateway's HTTP side, read under a deadline timer vs taken at once;
* the dispatcher's chain of async generators (``frames`` → ``observed`` → ``dispatch`` →
  ``_migrating`` → ``_once`` → ``_sequential``: ``LAYERS`` pass-through layers between the engine's
  frames and their reader) vs reading the frames flat, for a whole answer (2 frames: head, body)
  and a streamed 16-token one (18 frames);
* the gRPC chassis' unknown-field check of a request message (2026-12-03): the walk in Python
  (``strict_proto.unknown_field_paths`` without a wire size) vs the one-pass check the
  deserializer makes for messages up to 64 KiB, on a ``DispatchMany`` message of 1 and of 64
  requests.
"""

from __future__ import annotations

import asyncio
import time

import uvloop
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CollectorRegistry, Counter

from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.strict_proto import unknown_field_paths
from motor_common.tracing import TRACEPARENT, carrier_from, tracer

N = 20000
async def engine():
    f = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(f.set_result, 1)
    return await f

async def old_watch():
    task = asyncio.ensure_future(engine())
    try:
        while True:
            done, _ = await asyncio.wait((task,), timeout=0.05)
            if done:
                return task.result()
    finally:
        if not task.done():
            task.cancel()

async def new_watch():
    loop = asyncio.get_running_loop()
    t = asyncio.current_task()
    h = loop.call_later(0.05, t.cancel)
    try:
        return await engine()
    finally:
        h.cancel()

async def old_first():
    ev = asyncio.Event()
    read = asyncio.ensure_future(engine())
    moved = asyncio.ensure_future(ev.wait())
    try:
        await asyncio.wait({read, moved}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        moved.cancel()
    return read.result()

async def plain():
    return await engine()

LAYERS = 5


async def frames(n):
    for _ in range(n):
        yield b"x"


def passthrough(inner):
    async def layer():
        async for x in inner:
            yield x
    return layer()


async def read_through(layers, n):
    g = frames(n)
    for _ in range(layers):
        g = passthrough(g)
    async for _ in g:
        pass


def _dispatch_many(k):
    body = (b'{"model":"bench","prompt":"request 1: summarise the state of the fleet and the queue depth of '
            b'every prefill engine in one sentence","max_tokens":16,"temperature":0,"stream":false}')
    m = cpb.DispatchManyRequest(commands=[cpb.DispatchCommand(stream_id=i + 1, start=cpb.DispatchStart(
        request=cpb.DispatchRequest(request_id="r", api=1, body=body), timeout_ms=60000, window_bytes=262144,
        trace_context={"traceparent": "00-x"})) for i in range(k)])
    return cpb.DispatchManyRequest.FromString(m.SerializeToString())


def _per_call(fn, n):
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


async def bench(fn):
    t0 = time.perf_counter()
    for _ in range(N):
        await fn()
    return (time.perf_counter() - t0) / N * 1e6

async def main():
    base = await bench(plain)
    for name, fn in (("watchdog: task + asyncio.wait", old_watch), ("watchdog: timer in the caller's task", new_watch),
                     ("first frame: read task + route watcher + asyncio.wait", old_first)):
        print(f"{(await bench(fn)) - base:6.1f} us  {name} (over a plain await)")
    reg = CollectorRegistry()
    c = Counter("x", "x", ["model", "mode", "outcome"], registry=reg)
    t0 = time.perf_counter()
    for _ in range(N):
        c.labels("tiny", "pd", "success").inc()
    a = (time.perf_counter() - t0) / N * 1e6
    cache = {(c, "tiny", "pd", "success"): c.labels("tiny", "pd", "success")}
    t0 = time.perf_counter()
    for _ in range(N):
        cache[(c, "tiny", "pd", "success")].inc()
    b = (time.perf_counter() - t0) / N * 1e6
    print(f"{a:6.2f} us labels().inc()  vs {b:6.2f} us cached child .inc()")
    h = CIMultiDictProxy(CIMultiDict([("Host", "x"), ("Content-Type", "application/json"), ("Content-Length", "120"),
                                      ("User-Agent", "OpenAI/Python 1.0"), ("Accept", "*/*"), ("Authorization", "Bearer k")]))
    t0 = time.perf_counter()
    for _ in range(N):
        tracer().start("POST /v1/completions", carrier_from(h), kind="server",
                       attrs={"http.request.method": "POST", "http.route": "/v1/completions", "motor.request_id": "r"})
    a = (time.perf_counter() - t0) / N * 1e6
    t0 = time.perf_counter()
    for _ in range(N):
        TRACEPARENT in h or tracer().enabled
    b = (time.perf_counter() - t0) / N * 1e6
    print(f"{a:6.2f} us pass-through span per request vs {b:6.2f} us header check")
    q: asyncio.Queue[int] = asyncio.Queue()
    deadline = asyncio.get_running_loop().time() + 60
    t0 = time.perf_counter()
    for i in range(N):
        q.put_nowait(i)
        async with asyncio.timeout_at(deadline):
            await q.get()
    a = (time.perf_counter() - t0) / N * 1e6
    t0 = time.perf_counter()
    for i in range(N):
        q.put_nowait(i)
        if not q.empty():
            q.get_nowait()
    b = (time.perf_counter() - t0) / N * 1e6
    print(f"{a:6.2f} us a queued frame read under timeout_at vs {b:6.2f} us taken at once (gateway, per frame)")
    for k in (1, 64):
        msg = _dispatch_many(k)
        wire = msg.ByteSize()
        walk = min(_per_call(lambda msg=msg: unknown_field_paths(msg), N // k) for _ in range(3))
        fast = min(_per_call(lambda msg=msg, wire=wire: unknown_field_paths(msg, wire_size=wire), N // k) for _ in range(3))
        print(f"{walk:6.1f} us unknown-field walk vs {fast:6.1f} us one-pass check, DispatchMany of {k} request(s)")
    for n in (2, 18):
        flat = min([await bench(lambda n=n: read_through(0, n)) for _ in range(3)])
        chained = min([await bench(lambda n=n: read_through(LAYERS, n)) for _ in range(3)])
        print(f"{chained - flat:6.1f} us {LAYERS} async-generator layers over reading {n} frames flat "
              f"({flat:.1f} vs {chained:.1f} us per answer)")

if __name__ == "__main__":
    uvloop.install()
    asyncio.run(main())
