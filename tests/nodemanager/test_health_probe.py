"""The /health probe against engine-like HTTP servers that misbehave (raw sockets, real probe()):
an endless body is not buffered, and a malformed response with a long line (aiohttp's error quotes
it) gives a detail short enough for the controller's request limits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from motor_common.convert import endpoint_health_to_pb
from motor_common.domain import Endpoint, EndpointHealth, EndpointStatus
from motor_common.gen.motor.controller.v1 import controller_pb2 as cpb
from motor_common.request_limits import check_request
from motor_nodemanager.detail import MAX_DETAIL
from motor_nodemanager.endpoint_state import Observation
from motor_nodemanager.health import probe
from tests.nodemanager.conftest import Handler


async def _probe(ep: Endpoint, timeout: float) -> tuple[Observation, str]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        return await probe(session, ep, timeout)


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
