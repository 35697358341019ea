"""Memory of the gateway and the coordinator under large request bodies (issue: one 63 MB body
took the gateway to 449 MB; 8 concurrent 60 MB bodies to 2.2 GB / 2.6 GB).

    .venv/bin/python bench/hostile_bodies.py [--concurrency 8] [--front gateway|co-located]

Runs real simulated vLLM engines (P + D), motor-coordinator and motor-gateway (default limits),
then sends, each *concurrency* times at once: a 60 MB body announced with Content-Length, a
60 MB chunked body, and a body just under ``limits.max_body_bytes`` that goes through to the
engines (refused there for its length, like vLLM). Prints the statuses and the peak RSS of each
Motor process during each scenario (psutil, sampled every 10 ms). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import MODEL, ZERO, start_engines, start_motor  # noqa: E402
from motor_common.openai_front.limits import HttpLimits  # noqa: E402

BIG = 60 * 1024 * 1024


def body_of(size: int) -> bytes:
    head = b'{"model": "' + MODEL.encode() + b'", "max_tokens": 4, "prompt": "'
    filler = b"hello world, " * ((size - len(head) - 2) // 13)
    return head + filler + b'"}'


async def sample_rss(pids: dict[str, int], stop: asyncio.Event) -> dict[str, int]:
    procs = {name: psutil.Process(pid) for name, pid in pids.items()}
    peak = {name: p.memory_info().rss for name, p in procs.items()}
    while not stop.is_set():
        for name, p in procs.items():
            peak[name] = max(peak[name], p.memory_info().rss)
        await asyncio.sleep(0.01)
    return peak


async def send(http: aiohttp.ClientSession, url: str, data: bytes, chunked: bool) -> int:
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(data), 1 << 20):
            yield data[i:i + (1 << 20)]

    try:
        async with http.post(url, data=chunks() if chunked else data,
                             headers={"Content-Type": "application/json"}) as r:
            await r.read()
            return r.status
    except (aiohttp.ClientError, OSError):
        return -1  # the server closed the connection after its answer while we were still sending


async def scenario(name: str, url: str, pids: dict[str, int], data: bytes, n: int, chunked: bool) -> dict[str, Any]:
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_rss(pids, stop))
    start = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        statuses = await asyncio.gather(*(send(http, url, data, chunked) for _ in range(n)))
    elapsed = time.monotonic() - start
    await asyncio.sleep(0.2)
    stop.set()
    peak = await sampler
    counts = {str(k): v for k, v in sorted(Counter(statuses).items())}  # -1: closed while sending
    return {"scenario": name, "statuses": counts, "seconds": round(elapsed, 2),
            **{f"{k} peak MB": round(v / 2**20) for k, v in peak.items()}}


async def amain(args: argparse.Namespace) -> None:
    limit = HttpLimits().max_body_bytes
    with tempfile.TemporaryDirectory(prefix="motor-bodies-") as tmp:
        log_dir = Path(tmp)
        async with start_engines("vllm", log_dir, ZERO) as engines, \
                start_motor(engines, log_dir, co_located=args.front == "co-located") as target:
            names = ["coordinator"] if args.front == "co-located" else ["coordinator", "gateway"]
            pids = dict(zip(names, target.pids, strict=True))
            base = {f"{k} idle MB": round(psutil.Process(p).memory_info().rss / 2**20) for k, p in pids.items()}
            print(orjson.dumps(base).decode(), flush=True)
            url = target.url + "/v1/completions"
            big, under = body_of(BIG), body_of(limit - 1024)
            for name, data, chunked in (("60 MB, Content-Length", big, False),
                                        ("60 MB, chunked", big, True),
                                        (f"{len(under) / 2**20:.1f} MB (under the limit), to the engines", under, False)):
                row = await scenario(name, url, pids, data, args.concurrency, chunked)
                print(orjson.dumps(row).decode(), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--front", choices=("gateway", "co-located"), default="gateway")
    asyncio.run(amain(p.parse_args()))


if __name__ == "__main__":
    main()
