"""The /health probe against engine-like HTTP servers that misbehave (raw sockets, real probe()):
an endless body is not buffered, a malformed response with a long line (aiohttp's error quotes
it) gives a detail short enough for the controller's request limits, and a probe whose answer came
while the prober's own event loop was stalled is healthy, not timed out."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from motor_common.convert import endpoint_health_to_pb
from motor_common.domain import Endpoint, EndpointHealth, EndpointStatus
from motor_common.gen.motor.controller.v1 import controller_pb2 as cpb
from motor_common.request_limits import check_request
from motor_common.stall_clock import StallCompensatedClock, lag_monitor
from motor_nodemanager.detail import MAX_DETAIL
from motor_nodemanager.endpoint_state import Observation
from motor_nodemanager.health import probe
from tests.nodemanager.conftest import Handler


async def _probe(ep: Endpoint, timeout: float, clock: Callable[[], float] = time.monotonic) -> tuple[Observation, str]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        return await probe(session, ep, timeout, clock)


async def test_an_endless_health_body_is_not_read_and_the_probe_answers_from_the_status(
    engine: Callable[[Handler], Awaitable[Endpoint]],
) -> None:
    sent = 0
    chunk = b"x" * 65536
    done = asyncio.Event()

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            while True:  # until the client goes away
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()
                sent += len(chunk)
        except OSError:
            pass
        finally:
            writer.close()
            done.set()

    ep = await engine(endless)
    obs, detail = await _probe(ep, timeout=5.0)
    assert (obs, detail) == (Observation.HEALTHY, "")  # from the status: a timed-out probe is UNHEALTHY
    await asyncio.wait_for(done.wait(), 10)  # the probe closed the connection
    # what the server got rid of is what the socket buffers took: megabytes, not the gigabytes a
    # probe that reads the whole body takes in its 5 s
    assert sent < 64 * 1024 * 1024


MALFORMED = {
    "status line": b"HTTP/1.1 2OO " + b"b" * 6000 + b"\r\n\r\n",
    "chunk size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"z" * 6000 + b"\r\n",
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_a_malformed_answer_with_a_long_line_gives_a_detail_the_controller_accepts(
    case: str, engine: Callable[[Handler], Awaitable[Endpoint]],
) -> None:
    async def malformed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(MALFORMED[case])
        await writer.drain()
        writer.close()

    obs, detail = await _probe(await engine(malformed), timeout=5.0)
    assert obs is Observation.UNHEALTHY
    assert detail.startswith("/health failed: ") and "characters cut" in detail
    assert len(detail) <= MAX_DETAIL
    # the messages that carry it pass the controller's request checks
    check_request(cpb.HeartbeatRequest(node_id="n", sequence=1, endpoints=[endpoint_health_to_pb(
        EndpointHealth(0, EndpointStatus.ABNORMAL, 0, 123, True, detail))]))
    check_request(cpb.ReportFaultRequest(node_id="n", instance_id=1, level=cpb.FAULT_LEVEL_ENGINE_DEAD,
                                         source=cpb.FAULT_SOURCE_HEALTH_PROBE, pid=123, detail=detail))


async def test_a_redirect_is_not_followed_and_the_engine_is_unhealthy(
    engine: Callable[[Handler], Awaitable[Endpoint]],
) -> None:
    """Only the engine's own 200 says it is healthy, not the answer of a host its /health names."""
    elsewhere: list[bytes] = []

    async def healthy_other(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        elsewhere.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    other = await engine(healthy_other)

    async def redirect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 302 Found\r\nLocation: %s/health\r\nContent-Length: 0\r\n\r\n" % other.base_url.encode())
        await writer.drain()
        writer.close()

    assert await _probe(await engine(redirect), timeout=5.0) == (Observation.UNHEALTHY, "/health answered 302")
    assert elsewhere == []


def _engine_on_a_thread(handle: Callable[[socket.socket], None]) -> Endpoint:
    """A one-connection engine on its own thread: it answers while the test's event loop is blocked."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(30)

    def serve() -> None:
        with srv, srv.accept()[0] as conn:
            conn.settimeout(30)
            handle(conn)

    threading.Thread(target=serve, daemon=True).start()
    return Endpoint(0, "127.0.0.1", srv.getsockname()[1])


async def test_an_answer_that_came_while_the_prober_was_stalled_is_healthy_not_timed_out() -> None:
    """The engine answers in 0.2 s, but the prober's loop is blocked for 1.5 s from the moment its
    request arrived (the nodemanager starved of CPU): with a 0.5 s budget of its own responsive
    time the probe reads the answer waiting in its socket. A wall-clock timeout fires first on
    waking and called the engine dead (three in a row relaunched a healthy vLLM in CI)."""
    loop = asyncio.get_running_loop()
    clock = StallCompensatedClock(period=0.05, tolerance=0.05)
    monitor = asyncio.create_task(lag_monitor(clock, logging.getLogger(__name__), "the test's probe"))

    def answer_during_a_stall(conn: socket.socket) -> None:
        conn.recv(65536)
        loop.call_soon_threadsafe(time.sleep, 1.5)  # the prober's process stalls now
        time.sleep(0.2)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        conn.recv(1)  # until the prober closes

    try:
        t0 = time.monotonic()
        assert await _probe(_engine_on_a_thread(answer_during_a_stall), 0.5, clock) == (Observation.HEALTHY, "")
        assert time.monotonic() - t0 >= 1.5 and clock.stalled_total >= 1.0  # the stall happened, mid-probe

        # an engine that does not answer within the budget of responsive time still times out
        def silent(conn: socket.socket) -> None:
            conn.recv(65536)
            conn.recv(1)  # never answers; until the prober gives up and closes

        t0 = time.monotonic()
        assert await _probe(_engine_on_a_thread(silent), 0.5, clock) == (
            Observation.UNHEALTHY, "/health timed out after 0.5s")
        assert 0.5 <= time.monotonic() - t0 < 5.0
    finally:
        monitor.cancel()
