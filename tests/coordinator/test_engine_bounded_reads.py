"""What the coordinator reads of an engine's ops answers (/v1/models, /metrics, /health): the whole
body however it arrives, and never more than a bound. A real aiohttp server stands in for the engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest_asyncio
from aiohttp import web

from motor_coordinator import engine_client
from motor_coordinator.engine_client import EngineClient
from tests.coordinator.factories import ep

CARD = b'{"object":"list","data":[{"id":"m","object":"model","max_model_len":4096}]}'


async def _in_pieces(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    for i in range(0, len(CARD), 20):  # as a slow network delivers it: several reads' worth
        await resp.write(CARD[i:i + 20])
        await asyncio.sleep(0.02)
    await resp.write_eof()
    return resp


async def _huge(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()
    await resp.prepare(request)
    for _ in range(64):  # 4 MiB, past the test's bound
        await resp.write(b"x" * 65536)
    await resp.write_eof()
    return resp


@pytest_asyncio.fixture
async def engine() -> AsyncIterator[int]:
    app = web.Application()
    app.router.add_get("/v1/models", _in_pieces)
    app.router.add_get("/metrics", _huge)
    app.router.add_get("/health", _huge)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield port
    await runner.cleanup()


async def test_a_card_sent_in_pieces_is_read_whole_and_big_answers_are_refused(engine: int) -> None:
    assert engine_client.MAX_METRICS_BYTES >= 4 * 1024 * 1024  # vLLM's /metrics fits the default bound
    client = EngineClient(connect_timeout=2.0, probe_timeout=5.0, keepalive=1.0)
    await client.start()
    try:
        assert await client.get_bounded(ep(engine), "/v1/models", 1 << 20) == CARD  # was its first piece only
        assert await client.get_bounded(ep(engine), "/v1/models", len(CARD) - 1) is None
        assert await client.get_text(ep(engine), "/metrics", limit=1024 * 1024) is None  # 4 MiB: not taken
        assert await client.probe(ep(engine)) is True  # a 200, whatever its size (read up to a bound)
    finally:
        await client.close()
