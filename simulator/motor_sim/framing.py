"""A tiny framed request/response protocol over TCP.

Frame = 4-byte big-endian unsigned length + an orjson-encoded JSON object. One request frame and
one response frame per connection. Used by the vLLM-style NIXL side channel and the SGLang-style
bootstrap server.

Errors::

    PeerError   -> cannot reach the peer, timeout, or malformed frame (translated from OSError)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

log = logging.getLogger(__name__)
_LEN = struct.Struct(">I")
MAX_FRAME = 16 * 1024 * 1024

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class PeerError(Exception):
    """The peer could not be reached or answered garbage."""


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any]:
    head = await reader.readexactly(_LEN.size)
    (size,) = _LEN.unpack(head)
    if size > MAX_FRAME:
        raise PeerError(f"frame too large: {size} bytes")
    msg = orjson.loads(await reader.readexactly(size))
    if not isinstance(msg, dict):
        raise PeerError("frame is not a JSON object")
    return msg


def encode_frame(msg: dict[str, Any]) -> bytes:
    body = orjson.dumps(msg)
    return _LEN.pack(len(body)) + body


async def request(host: str, port: int, msg: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Send one frame, return the reply; every failure is a ``PeerError``."""
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(encode_frame(msg))
            await writer.drain()
            return await read_frame(reader)
    except TimeoutError as exc:
        raise PeerError(f"timed out after {timeout_s:g}s talking to {host}:{port}") from exc
    except (OSError, asyncio.IncompleteReadError, orjson.JSONDecodeError) as exc:
        raise PeerError(f"{host}:{port}: {exc}") from exc
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


class FrameServer:
    """Serves ``handler`` on a TCP port; owns its connection tasks and cancels them on close."""

    def __init__(self, handler: Handler, name: str) -> None:
        self._handler = handler
        self._name = name
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._on_conn, host, port, reuse_address=True)
        sock = self._server.sockets[0]
        return int(sock.getsockname()[1])

    async def _on_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            async with asyncio.timeout(10.0):
                msg = await read_frame(reader)
            reply = await self._handler(msg)
            writer.write(encode_frame(reply))
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, TimeoutError, PeerError, orjson.JSONDecodeError) as exc:
            log.debug("%s: bad peer connection: %s", self._name, exc)
        finally:
            self._tasks.discard(task)
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self._server.wait_closed()
