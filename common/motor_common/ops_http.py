"""HTTP ops endpoint for gRPC processes: ``/metrics`` (Prometheus), ``/health``, ``/ready``."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from motor_common.errors import ConfigError
from motor_common.ports import bind_failure

log = logging.getLogger(__name__)

Readiness = Callable[[], Awaitable[tuple[bool, str]]]


async def _always_ready() -> tuple[bool, str]:
    return True, "ok"


class OpsHttpServer:
    def __init__(self, host: str, port: int, readiness: Readiness | None = None) -> None:
        self.host, self.port = host, port
        self._readiness = readiness or _always_ready
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        app.router.add_get("/ready", self._ready)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            raise ConfigError(bind_failure(self.host, self.port, "set server.metrics_port or free it",
                                           exc.strerror or "")) from exc
        sockets = getattr(site._server, "sockets", None)
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        log.info("ops endpoint listening", extra={"address": f"{self.host}:{self.port}"})
        return self.port

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _health(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _ready(self, _: web.Request) -> web.Response:
        ready, reason = await self._readiness()
        return web.json_response({"ready": ready, "reason": reason}, status=200 if ready else 503)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
