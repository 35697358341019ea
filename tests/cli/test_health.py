"""Engine probe before registration: /v1/models must answer 200 with a non-empty model list."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from motor_cli.health import probe_all
from motor_common.domain import Endpoint

Factory = Callable[[web.Response], AsyncIterator[Endpoint]]


@pytest.fixture
async def engine() -> AsyncIterator[Callable[[int, object], object]]:
    runners: list[web.AppRunner] = []

    async def start(status: int, body: object) -> Endpoint:
        async def models(_: web.Request) -> web.Response:
            return web.json_response(body, status=status)

        app = web.Application()
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return Endpoint(id=0, ip="127.0.0.1", business_port=port)

    yield start  # type: ignore[misc]
    for runner in runners:
        await runner.cleanup()


async def test_engine_listing_a_model_is_healthy(engine) -> None:  # type: ignore[no-untyped-def]
    ep = await engine(200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]})
    (result,) = await probe_all([ep])
    assert result.healthy
    assert result.models == ("tiny",)


@pytest.mark.parametrize(
    ("status", "body", "detail"),
    [
        (200, {"object": "list", "data": []}, "empty model list"),
        (200, {"object": "list"}, "empty model list"),
        (200, [1, 2], "JSON object"),
        (503, {"error": "loading"}, "HTTP 503"),
    ],
)
async def test_engine_with_empty_or_bad_model_list_is_unhealthy(engine, status, body, detail) -> None:  # type: ignore[no-untyped-def]
    ep = await engine(status, body)
    (result,) = await probe_all([ep])
    assert not result.healthy
    assert detail in result.detail


async def test_unreachable_engine_is_unhealthy() -> None:
    from tests.helpers import free_port

    (result,) = await probe_all([Endpoint(id=0, ip="127.0.0.1", business_port=free_port())], timeout=2)
    assert not result.healthy
    assert "failed" in result.detail


async def test_an_engine_sending_an_endless_model_list_is_unhealthy_without_buffering_it() -> None:
    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(b'{"data": [')
        while True:  # before: read whole until the probe's timeout, ~2 GB in 5 s
            await resp.write(b'{"id": "m"},' * 8192)

    app = web.Application()
    app.router.add_get("/v1/models", endless)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        (result,) = await probe_all([Endpoint(id=0, ip="127.0.0.1", business_port=port)], timeout=2)
    finally:
        await runner.cleanup()
    assert not result.healthy
    assert result.detail == "GET /v1/models answered more than 1048576 bytes"
