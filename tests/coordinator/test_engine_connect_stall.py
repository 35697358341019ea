"""A connect to an engine that times out while the coordinator itself was frozen or starved is
tried again instead of failing the request (the CI failure of 2026-12-02: a 6.4 s stall of the
coordinator's loop on a loaded box turned a decode connect into 503 ``decode_failed``).

The connect timeout is real: a loopback listener whose accept queue is full drops new SYNs, so a
connect hangs until its timeout. The stall is the stall-compensated clock's view (a clock that did
not advance = the whole wait was a stall); with a clock that advanced, the same timeout fails as
before (the engine is unreachable)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterator

import orjson
import pytest
from aiohttp import web

from motor_coordinator.engine_client import EngineClient, EngineUnreachable
from tests.coordinator.factories import ep
from tests.helpers import wait_for


@pytest.fixture
def full_listener() -> Iterator[tuple[socket.socket, list[socket.socket]]]:
    """A listening socket whose accept queue is full (backlog 0, filled, never accepted)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    fillers = []
    for _ in range(3):
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(srv.getsockname())
        except BlockingIOError:
            pass
        fillers.append(c)
    yield srv, fillers
    for c in fillers:
        c.close()
    srv.close()


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


async def test_a_connect_timed_out_across_a_stall_is_tried_again(
    full_listener: tuple[socket.socket, list[socket.socket]],
) -> None:
    srv, _ = full_listener
    frozen = 100.0  # the compensated clock did not move: the whole wait was this process's stall
    client = EngineClient(connect_timeout=1.0, probe_timeout=1.0, keepalive=1.0, clock=lambda: frozen)
    records = _Records()
    log = logging.getLogger("motor_coordinator.engine_client")
    log.addHandler(records)
    log.setLevel(logging.INFO)
    app = web.Application()
    async def answer(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app.router.add_post("/v1/completions", answer)
    runner = web.AppRunner(app)
    await client.start()
    await runner.setup()
    try:
        task = asyncio.ensure_future(client.open(ep(srv.getsockname()[1]), "/v1/completions", {}, "rid"))
        await wait_for(lambda: any("timed out across a" in m for m in records.messages), timeout=10,
                       what="the first connect timed out across the stall")
        await web.SockSite(runner, srv).start()  # now the engine accepts: the second connect succeeds
        resp = await asyncio.wait_for(task, 10)
        assert resp.status == 200 and orjson.loads(await resp.content.read()) == {"ok": True}
        resp.release()
    finally:
        log.removeHandler(records)
        await client.close()
        await runner.cleanup()


async def test_a_connect_timeout_without_a_stall_still_fails(
    full_listener: tuple[socket.socket, list[socket.socket]],
) -> None:
    srv, _ = full_listener
    client = EngineClient(connect_timeout=0.6, probe_timeout=1.0, keepalive=1.0, clock=time.monotonic)
    await client.start()
    try:
        with pytest.raises(EngineUnreachable) as failed:
            await client.open(ep(srv.getsockname()[1]), "/v1/completions", {}, "rid")
        assert not failed.value.reached  # no connection: another engine may be tried
    finally:
        await client.close()
