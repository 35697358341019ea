"""The ops endpoint (/metrics, /health, /ready) answers anyone who reaches it, so what a caller can
hold there is bounded: open connections (one over the limit gets a 503 and is closed) and the time
a connection may go without a complete request head. Idle connections held the program's file
descriptors, which its gRPC server needs too. A real OpsHttpServer on loopback, raw sockets."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import REGISTRY

from motor_common import ops_http
from motor_common.ops_http import OpsHttpServer
from tests.helpers import wait_for


@pytest.fixture
async def ops(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[int]:
    monkeypatch.setattr(ops_http, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(ops_http, "HEADER_TIMEOUT_SEC", 0.5)
    server = OpsHttpServer("127.0.0.1", 0)
    port = await server.start()
    yield port
    await server.stop()


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setblocking(False)
    return s


def _closed_by_server(s: socket.socket) -> bytes | None:
    """What the server sent before closing *s*, or None while it is still open."""
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except BlockingIOError:
        return None
    return got


async def test_a_connection_over_the_limit_gets_a_503_and_idle_ones_are_closed(ops: int) -> None:
    idle = [_connect(ops) for _ in range(4)]
    over = _connect(ops)
    try:
        answer = await wait_for(
            lambda: _closed_by_server(over),
            timeout=5,
            what="the 5th connection answered and closed",
        )
        assert answer.startswith(b"HTTP/1.1 503 ")
        # the idle ones sent no request head: closed after the header timeout, nothing answered
        await wait_for(
            lambda: all(_closed_by_server(s) is not None for s in idle),
            timeout=5,
            what="idle connections closed by the server",
        )
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{ops}/health") as r:
            assert r.status == 200  # the slots are free again
        assert (REGISTRY.get_sample_value("motor_ops_connections_refused_total") or 0) >= 1
    finally:
        for s in (*idle, over):
            s.close()
