"""What `motor up` shows about the gateway's readiness: the gateway's own reason, from /ready,
or from /health on a gateway that has no /ready (where /health was readiness). Real HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from motor_cli.up import _gateway_ready

READY_503 = {"status": "unavailable", "reason": "no coordinator is ready: 127.0.0.1:9100 UNAVAILABLE"}


def route(body: dict[str, object], status: int = 200) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(_: web.Request) -> web.Response:
        return web.json_response(body, status=status)

    return handler


async def serve(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def split_gateway() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/health", route({"status": "ok"}))
    app.router.add_get("/ready", route(READY_503, 503))
    async for url in serve(app):
        yield url


@pytest.fixture
async def older_gateway() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/health", route(
        {"error": {"message": "no schedulable instance", "type": "service_unavailable"}}, 503))
    async for url in serve(app):
        yield url


async def test_reason_comes_from_ready_not_from_liveness(split_gateway: str) -> None:
    async with aiohttp.ClientSession() as http:
        assert await _gateway_ready(http, split_gateway) == (False, READY_503["reason"])


async def test_a_gateway_without_ready_is_read_from_health(older_gateway: str) -> None:
    async with aiohttp.ClientSession() as http:
        assert await _gateway_ready(http, older_gateway) == (False, "no schedulable instance")


async def test_an_unreachable_gateway_says_so() -> None:
    from tests.helpers import free_port

    async with aiohttp.ClientSession() as http:
        ok, why = await _gateway_ready(http, f"http://127.0.0.1:{free_port()}")
    assert not ok and why.startswith("unreachable (")
