"""HTTP to engines. The dispatch legs (:meth:`EngineClient.open`, ``post``, ``read_all``) go over
:mod:`engine_http`'s pooled keep-alive connections (asyncio protocols, httptools; TCP_NODELAY);
probes and scrapes over one shared aiohttp session. Connection errors are translated here into
:class:`EngineUnreachable`; HTTP statuses are returned, not raised.

An engine's answer is held to what an engine may send: redirects are never followed (an answer
must come from the engine the coordinator chose, not from a host it names), and a body the
coordinator holds whole (:func:`read_body`) stops at :data:`MAX_ANSWER_BYTES` after
decompression."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import aiohttp
import orjson

from motor_common.domain import Endpoint
from motor_common.tracing import Carrier
from motor_coordinator.engine_http import (
    EngineConnection,
    EnginePool,
    EngineResponse,
    HeadLost,
    request_bytes,
)

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"
# Seconds of this process's own stall during one engine call beyond which its timeout says nothing
# about the engine (the monitor's probes use it too).
STALL_TOLERANCE = 0.5
# Connects tried again after timing out across a stall of this process (then it counts).
STALLED_CONNECT_RETRIES = 2


# Bounds on what an engine's ops answers may make the coordinator read: a health probe, /metrics.
MAX_PROBE_BYTES = 64 * 1024
MAX_METRICS_BYTES = 8 * 1024 * 1024
# Bound on an answer the coordinator holds whole (a prefill's answer, a non-streamed answer),
# counted after decompression: what a gateway takes in one gRPC message (grpc_client).
MAX_ANSWER_BYTES = 64 * 1024 * 1024


class EngineUnreachable(Exception):
    """The engine could not be reached or dropped the connection before answering.

    ``reached`` is False when no connection was made (the request cannot have affected the
    engine), True when the engine dropped a connection the request may have been sent on."""

    def __init__(self, endpoint: Endpoint, cause: str, *, reached: bool = True, headed: bool = False) -> None:
        super().__init__(f"engine {endpoint.host_port} unreachable: {cause}")
        self.endpoint = endpoint
        self.reached = reached
        # The engine sent its answer's head, then its body broke (too large, cut short).
        self.headed = headed


class AnswerTooLarge(aiohttp.ClientPayloadError):
    """An answer the coordinator must hold whole passed :data:`MAX_ANSWER_BYTES`. A payload error,
    so the dispatcher treats it as the engine breaking its answer (the request fails, the log names
    the engine and the size)."""


class EngineClient:
    def __init__(self, *, connect_timeout: float, probe_timeout: float, keepalive: float,
                 clock: Callable[[], float] | None = None) -> None:
        """*clock*: the stall-compensated clock (``motor_common.stall_clock``): a connect that
        timed out while this process was frozen or starved is tried again (no connection was
        made, so the engine saw nothing) instead of failing the request."""
        self._connect_timeout = connect_timeout
        self._clock = clock
        self._keepalive = keepalive  # below the engines' own keep-alive: DispatchConfig.engine_keepalive_sec
        self._probe_timeout = aiohttp.ClientTimeout(total=probe_timeout)
        self._session: aiohttp.ClientSession | None = None
        self._pools: dict[str, EnginePool] = {}  # host:port -> keep-alive connections (the dispatch legs)

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=self._keepalive, enable_cleanup_closed=True)
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self._connect_timeout, sock_connect=self._connect_timeout
        )
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, json_serialize=lambda o: orjson.dumps(o).decode()
        )

    async def close(self) -> None:
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("EngineClient.start() was not called")
        return self._session

    async def open(
        self, endpoint: Endpoint, path: str, body: dict[str, Any], request_id: str, *, trace: Carrier = (),
        method: str = "POST",
    ) -> EngineResponse:
        """POST *body* as JSON (or GET, without a body) and return the response once its head
        arrived (caller closes it). *trace*: W3C trace headers (``traceparent``, ``tracestate``).
        On a pooled keep-alive connection of :mod:`engine_http` (not aiohttp's client)."""
        headers = {REQUEST_ID_HEADER: request_id, **dict(trace)}
        data = None
        if method != "GET":
            headers["Content-Type"] = "application/json"
            data = orjson.dumps(body)
        request = request_bytes(method, path, endpoint.host_port, headers, data)
        pool = self._pools.get(endpoint.host_port)
        if pool is None:
            pool = self._pools[endpoint.host_port] = EnginePool(endpoint.ip, endpoint.business_port, self._keepalive)
        conn = pool.idle_connection() or await self._connect(pool, endpoint)
        try:
            resp = await conn.send(request)
        except HeadLost as exc:
            raise EngineUnreachable(endpoint, f"{type(exc).__name__}: {exc}", reached=True) from exc
        except BaseException:
            conn.drop()  # cancelled while waiting for the head: the engine sees the disconnect
            raise
        if 300 <= resp.status < 400:
            # Not followed: the engine did not take the request (reached=False: retried elsewhere).
            location = resp.headers.get("Location", "")
            resp.close()
            raise EngineUnreachable(endpoint, f"answered HTTP {resp.status} (a redirect to {location[:200]!r}), "
                                              "which the coordinator does not follow", reached=False)
        return resp

    async def _connect(self, pool: EnginePool, endpoint: Endpoint) -> EngineConnection:
        """A new connection to *endpoint*'s engine; a connect that timed out across a stall of this
        process is tried again. ``EngineUnreachable(reached=False)``: nothing reached the engine."""
        for attempt in range(STALLED_CONNECT_RETRIES + 1):
            clock = self._clock
            sent_at, raw_sent = (clock(), time.monotonic()) if clock is not None else (0.0, 0.0)
            try:
                return await pool.connect(self._connect_timeout)
            except (OSError, TimeoutError) as exc:
                if (clock is not None and isinstance(exc, TimeoutError) and attempt < STALLED_CONNECT_RETRIES
                        and (stalled := (time.monotonic() - raw_sent) - (clock() - sent_at)) > STALL_TOLERANCE):
                    log.info("connect to engine %s timed out across a %.1fs stall of this process: trying "
                             "again", endpoint.host_port, stalled)
                    continue
                raise EngineUnreachable(endpoint, f"{type(exc).__name__}: {exc}", reached=False) from exc
        raise AssertionError("unreachable")  # the loop returns or raises

    @asynccontextmanager
    async def post(
        self, endpoint: Endpoint, path: str, body: dict[str, Any], request_id: str, *, trace: Carrier = ()
    ) -> AsyncIterator[EngineResponse]:
        """:meth:`open` as a context; the connection is dropped (not reused) if the caller leaves
        early, so the engine sees the disconnect and aborts the request."""
        resp = await self.open(endpoint, path, body, request_id, trace=trace)
        try:
            yield resp
        except BaseException:
            resp.close()
            raise
        finally:
            resp.release()

    async def read_all(
        self, endpoint: Endpoint, path: str, body: dict[str, Any], request_id: str, *, trace: Carrier = ()
    ) -> tuple[int, str, bytes]:
        """POST and read the whole answer: (status, content type, body)."""
        async with self.post(endpoint, path, body, request_id, trace=trace) as resp:
            try:
                data = await read_body(resp)
            except (aiohttp.ClientError, OSError) as exc:
                raise EngineUnreachable(endpoint, f"{type(exc).__name__}: {exc}", headed=True) from exc
            return resp.status, resp.headers.get("Content-Type", ""), data

    async def probe(self, endpoint: Endpoint, path: str = "/health") -> bool:
        try:
            async with self.session.get(endpoint.base_url + path, timeout=self._probe_timeout,
                                        allow_redirects=False) as resp:
                await _read_at_most(resp.content, MAX_PROBE_BYTES)  # drained (up to a bound) to reuse the connection
                return resp.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    async def get_text(self, endpoint: Endpoint, path: str, limit: int = MAX_METRICS_BYTES) -> str | None:
        """GET *path*: the text of a 200 answer, None for any other answer, an error, or a body
        longer than *limit* bytes."""
        data = await self.get_bounded(endpoint, path, limit)
        try:
            return None if data is None else data.decode()
        except UnicodeDecodeError:
            return None

    async def get_bounded(self, endpoint: Endpoint, path: str, limit: int) -> bytes | None:
        """GET *path*: the whole body of a 200 answer, None for any other answer, an error, or a
        body longer than *limit* bytes (not read past it)."""
        try:
            async with self.session.get(endpoint.base_url + path, timeout=self._probe_timeout,
                                        allow_redirects=False) as resp:
                if resp.status != 200:
                    return None
                return await _read_at_most(resp.content, limit)
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None


async def read_body(resp: EngineResponse) -> bytes:
    """The whole body of an answer the coordinator holds (instead of ``resp.read()``, which has no
    bound); :class:`AnswerTooLarge` past :data:`MAX_ANSWER_BYTES` (decompressed), nothing more read."""
    data = await _read_at_most(resp.content, MAX_ANSWER_BYTES)
    if data is None:
        raise AnswerTooLarge(f"the engine's answer is larger than {MAX_ANSWER_BYTES} bytes (not read further)")
    return data


class _Readable(Protocol):
    async def read(self, n: int = -1) -> bytes: ...


async def _read_at_most(content: _Readable, limit: int) -> bytes | None:
    """The whole body, or None once it passes *limit* bytes. ``read(n)`` returns what has arrived
    so far, not n bytes: one read cut an answer that came in several pieces short."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await content.read(min(limit + 1 - size, 1 << 16)):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
