"""HealthPoller start/stop against a real HTTP server: a stop racing a start never leaves a probe
task on a closed session, and no background task dies on shutdown ("Session is closed")."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from motor_common.domain import Endpoint
from motor_nodemanager.endpoint_state import Observation
from motor_nodemanager.health import HealthPoller, PollSettings
from tests.helpers import wait_for


async def _ok(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _health_server(health: Callable[[web.Request], Awaitable[web.Response]] = _ok) -> tuple[web.AppRunner, int]:
    """An HTTP server in this process answering /health with *health* (200 "ok"); (its runner, its
    port)."""
    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


async def test_stop_racing_start_leaves_no_task_and_no_task_dies(caplog: pytest.LogCaptureFixture) -> None:
    runner, port = await _health_server()
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


@pytest.mark.parametrize("verify", [True, False])
async def test_a_200_from_a_process_other_than_the_engine_counts_only_with_the_check_off(verify: bool) -> None:
    """health.verify_port_owner: the port is served by this test process, the "engine" is another
    process (a sleeper): with the check on the 200 is UNHEALTHY and the detail names the holder;
    with it off (a wrapper serving the port from outside its tree) the 200 is believed."""
    runner, port = await _health_server()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    seen: list[tuple[Observation, str]] = []
    poller = HealthPoller(lambda: PollSettings(0.01, 1.0, 5.0, verify), lambda _: 0,
                          lambda _eid, obs, _gen, detail: seen.append((obs, detail)), lambda _: sleeper.pid)
    try:
        await poller.start([Endpoint(0, "127.0.0.1", port)])
        await wait_for(lambda: len(seen) >= 3, timeout=20, what="three probes")
        await poller.stop()
    finally:
        sleeper.kill()
        sleeper.wait(5)
        await runner.cleanup()
    if verify:
        assert {obs for obs, _ in seen} == {Observation.UNHEALTHY}
        assert f"port {port} is served by another process (pid {os.getpid()})" in seen[0][1]
    else:
        assert {obs for obs, _ in seen} == {Observation.HEALTHY}


@pytest.mark.parametrize("threshold", [1, 3])
async def test_failed_probes_count_only_as_the_thresholds_in_a_row(threshold: int) -> None:
    """health.failure_threshold against a real server scripted 200, 500, 500, 200, 500 five times: with 1
    every failure is passed on; with 3 the two isolated failures are swallowed (the 200 between
    resets the count) and only the third of the five in a row is passed on, then every one after."""
    script = [200, 500, 500, 200, 500, 500, 500, 500, 500]
    served: list[int] = []

    async def health(_: web.Request) -> web.Response:
        status = script[len(served)] if len(served) < len(script) else 500
        served.append(status)
        return web.Response(status=status)

    runner, port = await _health_server(health)
    seen: list[Observation] = []
    poller = HealthPoller(lambda: PollSettings(0.01, 1.0, 5.0, False, threshold), lambda _: 0,
                          lambda _eid, obs, _gen, _detail: seen.append(obs))
    try:
        await poller.start([Endpoint(0, "127.0.0.1", port)])
        # one probe past the script: the last scripted one has been observed
        await wait_for(lambda: len(served) > len(script), timeout=20, what="the scripted probes")
        await poller.stop()
    finally:
        await runner.cleanup()
    H, U = Observation.HEALTHY, Observation.UNHEALTHY
    want = [H, U, U, H, U, U, U, U, U] if threshold == 1 else [H, H, U, U, U]
    assert seen[: len(want)] == want, seen
