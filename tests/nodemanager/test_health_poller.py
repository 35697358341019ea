"""HealthPoller start/stop against a real HTTP server: a stop racing a start never leaves a probe
task on a closed session, and no background task dies on shutdown ("Session is closed")."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp import web

from motor_common.domain import Endpoint
from motor_nodemanager.endpoint_state import Observation
from motor_nodemanager.health import HealthPoller, PollSettings
from tests.helpers import wait_for


async def test_stop_racing_start_leaves_no_task_and_no_task_dies(caplog: pytest.LogCaptureFixture) -> None:
    app = web.Application()
    app.router.add_get("/health", lambda _: web.Response(text="ok"))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    seen: list[Observation] = []
    poller = HealthPoller(lambda: PollSettings(0.001, 1.0, 5.0), lambda _: 0,
                          lambda _eid, obs, _gen, _detail: seen.append(obs))
    ep = Endpoint(0, "127.0.0.1", port)
    caplog.set_level(logging.WARNING)
    try:
        for _ in range(30):
            await asyncio.gather(poller.start([ep]), poller.stop(), poller.start([ep]), poller.stop())
        await poller.start([ep])
        await wait_for(lambda: Observation.HEALTHY in seen, timeout=10, what="a HEALTHY probe")
        await asyncio.gather(poller.stop(), poller.start([ep]))
        await poller.stop()
        assert poller._tasks._tasks == set() and poller._session is None
    finally:
        await runner.cleanup()
    assert not [r for r in caplog.records if "Session is closed" in r.getMessage() or "died" in r.getMessage()]
