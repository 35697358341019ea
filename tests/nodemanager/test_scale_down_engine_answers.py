"""What the DP scale-down proxy reads of an engine's answers (raw-socket engines, the real calls):
an endless status body or refusal body is not buffered, and redirects are not followed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp

from motor_common.domain import Endpoint
from motor_nodemanager import scale_down_proxy as sdp
from tests.nodemanager.conftest import Handler


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """The request's head and body (the apply POSTs one)."""
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return head + await reader.readexactly(int(line.split(b":", 1)[1]))
    return head


def endless(status: bytes, sent: list[int], done: asyncio.Event) -> Handler:
    """An engine answering *status* with a JSON body that never ends; *sent*: bytes it got rid of."""
    chunk = b" " * 65536

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        start = b'{"status": "healthy", "x":"'
        writer.write(
            b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"%x\r\n%s\r\n" % (status, len(start), start)
        )
        try:
            while True:  # until the client goes away
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()
                sent[0] += len(chunk)
        except OSError:
            pass
        finally:
            writer.close()
            done.set()

    return handler


def session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=sdp.ENGINE_TIMEOUT_SEC))


async def test_an_endless_status_body_is_no_answer_and_is_not_buffered(
    engine: Callable[[Handler], Awaitable[Endpoint]],
) -> None:
    sent, done = [0], asyncio.Event()
    ep = await engine(endless(b"200 OK", sent, done))
    async with session() as s:
        assert await sdp._get_status(s, ep) is None
    await asyncio.wait_for(done.wait(), 10)  # the proxy closed the connection
    # what the engine got rid of is what the socket buffers took, not what 2 s of loopback carry
    assert sent[0] < 16 * 1024 * 1024


async def test_a_refused_apply_with_an_endless_body_names_its_start_and_is_not_buffered(
    engine: Callable[[Handler], Awaitable[Endpoint]],
) -> None:
    sent, done = [0], asyncio.Event()
    ep = await engine(endless(b"500 Internal Server Error", sent, done))
    async with session() as s:
        error = await sdp._post_apply(s, ep, [1])
    assert error.startswith('endpoint 0: /fault_tolerance/apply answered 500: {"status": "healthy"')
    assert len(error) < 400
    await asyncio.wait_for(done.wait(), 10)
    assert sent[0] < 16 * 1024 * 1024


async def test_a_redirected_status_or_apply_is_not_followed(
    engine: Callable[[Handler], Awaitable[Endpoint]],
) -> None:
    elsewhere: list[bytes] = []

    async def other(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        elsewhere.append(await read_request(reader))
        writer.write(
            b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 21\r\n\r\n{"status": "healthy"}'
        )
        await writer.drain()
        writer.close()

    target = await engine(other)

    async def redirect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 307 Temporary Redirect\r\nLocation: %s/fault_tolerance/x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            % target.base_url.encode()
        )
        await writer.drain()
        writer.close()

    ep = await engine(redirect)
    async with session() as s:
        assert await sdp._get_status(s, ep) is None
        assert (
            await sdp._post_apply(s, ep, [1]) == "endpoint 0: /fault_tolerance/apply answered 307: "
        )
    assert elsewhere == []
