"""A small asyncio load generator for OpenAI-compatible endpoints (aiohttp, keep-alive).

Measures per request: total latency, time to first token (streaming), time between tokens, the
response bytes (for non-streaming identity checks) and failures. Used by every benchmark in bench/
so all targets are driven by the same client.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson


@dataclass
class Sample:
    ok: bool
    status: int
    latency: float
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    body: bytes = b""
    error: str = ""


@dataclass
class RunResult:
    label: str
    concurrency: int
    stream: bool
    wall: float
    samples: list[Sample]

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.ok]

    @property
    def failures(self) -> int:
        return len(self.samples) - len(self.ok)

    @property
    def rps(self) -> float:
        return len(self.ok) / self.wall if self.wall > 0 else 0.0

    def pct(self, values: list[float], q: float) -> float:
        if not values:
            return float("nan")
        values = sorted(values)
        k = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
        return values[k]

    def latency(self, q: float) -> float:
        return self.pct([s.latency for s in self.ok], q)

    def ttft(self, q: float) -> float:
        return self.pct([s.ttft for s in self.ok if s.ttft is not None], q)

    def itl(self, q: float) -> float:
        return self.pct([x for s in self.ok for x in s.itl], q)

    def summary(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "concurrency": self.concurrency,
            "stream": self.stream,
            "requests": len(self.samples),
            "failures": self.failures,
            "rps": round(self.rps, 1),
            "latency_p50_ms": round(self.latency(50) * 1e3, 3),
            "latency_p99_ms": round(self.latency(99) * 1e3, 3),
            "ttft_p50_ms": round(self.ttft(50) * 1e3, 3) if self.stream else None,
            "ttft_p99_ms": round(self.ttft(99) * 1e3, 3) if self.stream else None,
            "itl_p50_ms": round(self.itl(50) * 1e3, 3) if self.stream else None,
            "mean_latency_ms": round(statistics.fmean([s.latency for s in self.ok]) * 1e3, 3) if self.ok else None,
        }


async def one_request(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], *, timeout: float = 60.0
) -> Sample:
    stream = bool(body.get("stream"))
    start = time.perf_counter()
    try:
        async with session.post(
            url, data=orjson.dumps(body), headers={"Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as resp:
            if not stream:
                data = await resp.read()
                return Sample(resp.status == 200, resp.status, time.perf_counter() - start, body=data,
                              error="" if resp.status == 200 else data[:200].decode(errors="replace"))
            ttft: float | None = None
            last = start
            itl: list[float] = []
            saw_done = False
            buf = b""
            async for chunk in resp.content.iter_any():
                now = time.perf_counter()
                buf += chunk
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    if not event.startswith(b"data:"):
                        continue
                    payload = event[5:].strip()
                    if payload == b"[DONE]":
                        saw_done = True
                        continue
                    if ttft is None:
                        ttft = now - start
                    else:
                        itl.append(now - last)
                    last = now
            ok = resp.status == 200 and saw_done
            return Sample(ok, resp.status, time.perf_counter() - start, ttft=ttft, itl=itl,
                          error="" if ok else f"status {resp.status}, done={saw_done}")
    except (TimeoutError, aiohttp.ClientError) as exc:
        return Sample(False, 0, time.perf_counter() - start, error=f"{type(exc).__name__}: {exc}")


Sender = Callable[[aiohttp.ClientSession, dict[str, Any]], Awaitable[Sample]]


async def run_load(
    label: str,
    url: str,
    make_body: Callable[[int], dict[str, Any]],
    *,
    concurrency: int,
    requests: int,
    warmup: int = 10,
    timeout: float = 60.0,
    duration: float | None = None,
    send: Sender | None = None,
    on_start: Callable[[], None] | None = None,
) -> RunResult:
    """Send *requests* requests with *concurrency* workers over one keep-alive session.

    With *duration*, workers keep sending until *duration* seconds passed **and** at least
    *requests* were sent (whichever is later, so short runs still collect enough samples). *send*
    replaces the plain POST to *url* (e.g. a client doing the PD hand-off itself); *on_start* runs
    right before the measured part (after warm-up), e.g. to snapshot CPU counters.
    """
    async def default_send(session: aiohttp.ClientSession, body: dict[str, Any]) -> Sample:
        return await one_request(session, url, body, timeout=timeout)

    sender = send or default_send
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        for i in range(warmup):
            await sender(session, make_body(-1 - i))
        samples: list[Sample] = []
        next_index = 0
        start = time.perf_counter()
        stop_at = start + duration if duration else None

        def take() -> int | None:
            nonlocal next_index
            if stop_at is None:
                if next_index >= requests:
                    return None
            elif next_index >= requests and time.perf_counter() >= stop_at:
                return None
            next_index += 1
            return next_index - 1

        async def worker() -> None:
            while (i := take()) is not None:
                samples.append(await sender(session, make_body(i)))

        if on_start is not None:
            on_start()
        start = time.perf_counter()
        stop_at = start + duration if duration else None
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    stream = bool(make_body(0).get("stream"))
    return RunResult(label, concurrency, stream, wall, samples)
