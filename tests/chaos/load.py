"""A bounded closed-loop load of OpenAI clients for the chaos suite, recording every failure.

``clients`` workers (half of them streaming) each send one request, wait for the whole answer, and
send the next one at once — bounded by ``duration`` seconds **and** ``max_requests`` requests in
total, whichever comes first, and each request by ``timeout`` seconds. Plain aiohttp (the HTTP the
openai SDK would send, parsed strictly) so that every failure keeps its status, its body and its
``Retry-After`` header.

A request succeeds when the answer is complete and well formed: non-streaming, status 200 and a
JSON body with a non-empty ``choices[0].text``; streaming, status 200, only ``data:`` events that
parse as JSON completion chunks, no error event, text received, and ``data: [DONE]`` at the end.
Anything else — a status other than 200, a cut connection, a stream that stops early or carries
an error event, a timeout — is a failure, kept with what the client saw.

**Several gateways** (``urls``): client *i* starts on ``urls[(i // 2) % len(urls)]`` (so each
gateway has streaming and non-streaming clients). When a gateway cannot
be reached — the connection is refused, or it closes before the HTTP status line arrived — the
client sends the same request to the next gateway (each gateway at most once per request). Nothing
has reached the application then, so this retry cannot duplicate output; it is what a client-side
list of gateways (or a TCP load balancer's health check) does. After the status line nothing is
retried: a stream cut half-way through is a failure. No retry on an HTTP error status either (the
SDKs' own retries are off), so a 503 counts as a failed request.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson


@dataclass
class Outcome:
    """One request as the client saw it (times: ``time.monotonic()``)."""

    client: int
    stream: bool
    start: float
    end: float
    ok: bool
    status: int = 0  # 0: no HTTP status received
    error: str = ""
    body: str = ""  # first 300 bytes of an error body / the last stream bytes
    retry_after: str | None = None
    gateway: str = ""
    attempts: int = 1  # gateways tried (connection failures before the status line)
    bytes_before_failure: int = 0  # stream bytes the client had received when it failed

    def describe(self) -> str:
        kind = "stream" if self.stream else "plain"
        ra = f" Retry-After={self.retry_after}" if self.retry_after is not None else ""
        return f"{kind} status={self.status}{ra} {self.error} {self.body[:160]!r} via {self.gateway}"


class _Unreachable(Exception):
    """The gateway failed before the HTTP status line: the request may go to another gateway."""


@dataclass
class ClosedLoop:
    urls: list[str]  # gateway base URLs, e.g. "http://127.0.0.1:8000"
    model: str
    clients: int = 16
    duration: float = 45.0
    max_requests: int = 20_000
    timeout: float = 15.0
    max_tokens: int = 24
    outcomes: list[Outcome] = field(default_factory=list)
    sent: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None
    _extra: list[asyncio.Task[None]] = field(default_factory=list)
    started_at: float = 0.0

    # --- control --------------------------------------------------------------------------------
    def start(self) -> None:
        self.started_at = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="chaos-load")

    def long_streams(self, n: int, max_tokens: int) -> None:
        """*n* extra streaming requests of *max_tokens* each (counted like the others), e.g. to have
        streams in flight on every decode engine when one dies; awaited by :meth:`stop`."""

        async def one(k: int) -> None:
            async with aiohttp.ClientSession() as session:
                body = {"model": self.model, "prompt": f"chaos long stream {k}", "max_tokens": max_tokens,
                        "stream": True}
                self.outcomes.append(await self._one(session, 2 * k + 1, body))

        loop = asyncio.get_running_loop()
        self._extra += [loop.create_task(one(k), name=f"chaos-long-stream-{k}") for k in range(n)]

    async def stop(self) -> None:
        """Stop sending; wait (bounded by one request timeout) for the requests in flight."""
        self._stop.set()
        if self._extra:
            await asyncio.wait(self._extra, timeout=self.timeout + 5)
            for t in self._extra:
                t.cancel()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), self.timeout + 5)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task

    async def __aenter__(self) -> ClosedLoop:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_completed(self, n: int, timeout: float = 20.0) -> None:
        """Until *n* more requests succeeded (the load is flowing)."""
        from tests.helpers import wait_for

        target = len(self.succeeded()) + n
        await wait_for(lambda: len(self.succeeded()) >= target, timeout=timeout,
                       what=f"{n} successful requests under load")

    # --- figures --------------------------------------------------------------------------------
    def succeeded(self, after: float = 0.0) -> list[Outcome]:
        return [o for o in self.outcomes if o.ok and o.end >= after]

    def failures(self, after: float = 0.0, before: float = float("inf")) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok and after <= o.end <= before]

    def statuses(self, outcomes: list[Outcome] | None = None) -> dict[str, int]:
        return dict(Counter(str(o.status) for o in (self.failures() if outcomes is None else outcomes)))

    def longest_gap(self, after: float, before: float) -> float:
        """Longest time in [after, before] without any request completing successfully."""
        ends = sorted(o.end for o in self.outcomes if o.ok and after <= o.end <= before)
        points = [after, *ends, before]
        return max(b - a for a, b in itertools.pairwise(points))

    def report(self, limit: int = 12) -> str:
        fails = self.failures()
        lines = [f"{len(self.outcomes)} requests, {len(fails)} failed, statuses {self.statuses()}"]
        lines += [f"  t+{o.end - self.started_at:6.2f}s {o.describe()}" for o in fails[:limit]]
        return "\n".join(lines)

    # --- the loop -------------------------------------------------------------------------------
    def _take(self, deadline: float) -> bool:
        if self._stop.is_set() or self.sent >= self.max_requests or time.monotonic() >= deadline:
            return False
        self.sent += 1
        return True

    async def _run(self) -> None:
        deadline = time.monotonic() + self.duration
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            await asyncio.gather(*(self._client(session, i, deadline) for i in range(self.clients)))

    async def _client(self, session: aiohttp.ClientSession, i: int, deadline: float) -> None:
        stream = i % 2 == 1
        n = 0
        while self._take(deadline):
            n += 1
            body = {"model": self.model, "prompt": f"chaos client {i} request {n}",
                    "max_tokens": self.max_tokens, "stream": stream}
            outcome = await self._one(session, i, body)
            self.outcomes.append(outcome)
            if not outcome.ok:
                # a failed client pauses 50 ms (fast 503s would otherwise spin the loop at 100 % CPU)
                await asyncio.sleep(0.05)

    async def _one(self, session: aiohttp.ClientSession, i: int, body: dict[str, Any]) -> Outcome:
        stream = bool(body["stream"])
        start = time.monotonic()
        end_by = start + self.timeout
        # clients 0,1 on gateway 0, clients 2,3 on gateway 1, …: streaming and plain on each
        first = i // 2
        order = [self.urls[(first + k) % len(self.urls)] for k in range(len(self.urls))]
        last_error = ""
        for attempt, url in enumerate(order, 1):
            try:
                return await asyncio.wait_for(
                    self._send(session, url, body, i, start, attempt), max(0.01, end_by - time.monotonic())
                )
            except _Unreachable as exc:
                last_error = str(exc)
                continue
            except TimeoutError:
                return Outcome(i, stream, start, time.monotonic(), False, error="client timeout",
                               gateway=url, attempts=attempt)
        return Outcome(i, stream, start, time.monotonic(), False, error=last_error,
                       gateway=",".join(order), attempts=len(order))

    async def _send(
        self, session: aiohttp.ClientSession, url: str, body: dict[str, Any], i: int, start: float, attempt: int
    ) -> Outcome:
        stream = bool(body["stream"])

        def done(ok: bool, **kw: Any) -> Outcome:
            return Outcome(i, stream, start, time.monotonic(), ok, gateway=url, attempts=attempt, **kw)

        try:
            resp = await session.post(f"{url}/v1/completions", data=orjson.dumps(body),
                                      headers={"Content-Type": "application/json"})
        except (aiohttp.ClientConnectionError, aiohttp.ServerDisconnectedError) as exc:
            raise _Unreachable(f"{type(exc).__name__}: {exc}") from None
        try:
            status = resp.status
            retry_after = resp.headers.get("Retry-After")
            if status != 200:
                data = await resp.read()
                return done(False, status=status, retry_after=retry_after,
                            body=data[:300].decode(errors="replace"), error="HTTP error status")
            if not stream:
                data = await resp.read()
                try:
                    text = orjson.loads(data)["choices"][0]["text"]
                except (ValueError, KeyError, IndexError, TypeError):
                    return done(False, status=status, body=data[:300].decode(errors="replace"),
                                error="malformed body")
                return done(bool(text), status=status, error="" if text else "empty text")
            return await self._read_stream(resp, done)
        except (aiohttp.ClientError, ConnectionError) as exc:
            return done(False, status=resp.status, error=f"{type(exc).__name__}: {exc}"[:200])
        finally:
            resp.release()

    @staticmethod
    async def _read_stream(resp: aiohttp.ClientResponse, done: Callable[..., Outcome]) -> Outcome:
        buf = b""
        received = 0
        text = ""
        saw_done = False
        async for chunk in resp.content.iter_any():
            received += len(chunk)
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.strip():
                    continue
                if not event.startswith(b"data:"):
                    return done(False, status=200, error="not an SSE data event",
                                body=event[:300].decode(errors="replace"), bytes_before_failure=received)
                payload = event[5:].strip()
                if payload == b"[DONE]":
                    saw_done = True
                    continue
                if saw_done:
                    return done(False, status=200, error="event after [DONE]", bytes_before_failure=received)
                try:
                    obj = orjson.loads(payload)
                except ValueError:
                    return done(False, status=200, error="event is not JSON",
                                body=payload[:300].decode(errors="replace"), bytes_before_failure=received)
                if "error" in obj:
                    return done(False, status=200, error="error event in stream",
                                body=payload[:300].decode(errors="replace"), bytes_before_failure=received)
                with contextlib.suppress(KeyError, IndexError, TypeError):
                    text += obj["choices"][0].get("text") or ""
        if not saw_done:
            return done(False, status=200, error="stream ended without [DONE]",
                        body=buf[-300:].decode(errors="replace"), bytes_before_failure=received)
        if buf.strip():
            return done(False, status=200, error="trailing bytes after the last event",
                        body=buf[:300].decode(errors="replace"), bytes_before_failure=received)
        return done(bool(text), status=200, error="" if text else "no text streamed")
