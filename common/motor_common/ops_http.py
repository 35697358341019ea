"""HTTP ops endpoint for gRPC processes: ``/metrics`` (Prometheus), ``/health``, ``/ready``.

Its transport follows ``server.ops_tls`` (:func:`ops_server`): with the program's TLS identity it
is HTTPS with the same certificate as the gRPC port (reloaded the same way); when the gRPC port
requires client certificates, ``/metrics`` does too (a certificate from ``tls.ca_file``, asked
for at the handshake and checked per request: 403 without one), while ``/health`` and ``/ready``
answer without one, because Kubernetes' HTTPS probes present no client certificate and carry
nothing secret. ``ops_tls: https`` drops the client-certificate check, ``plaintext`` keeps plain
HTTP (a Prometheus that scrapes without TLS; keep the port on a private network).

The port answers anyone who reaches it, so what a caller can hold is bounded: at most
:data:`MAX_CONNECTIONS` open connections (one more gets a 503 and is closed, counted in
``motor_ops_connections_refused_total``), a connection without a complete request head for
:data:`HEADER_TIMEOUT_SEC` is closed, and so is a TLS handshake that takes longer. Without these, idle
connections held the program's file descriptors, which its gRPC server and its outbound
connections need too."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest

from motor_common.errors import ConfigError
from motor_common.grpc_server import ServerConfig
from motor_common.openai_front.site import GuardedSite
from motor_common.ports import bind_failure
from motor_common.tls import TlsConfig, https_context

log = logging.getLogger(__name__)

Readiness = Callable[[], Awaitable[tuple[bool, str]]]

# Probes and a scraper or two need a handful of connections at once.
MAX_CONNECTIONS = 64
# Seconds a connection may go without a complete request head (and a TLS handshake may take).
HEADER_TIMEOUT_SEC = 10.0

REFUSED = Counter("motor_ops_connections_refused",
                  "Connections to the ops endpoint answered 503 and closed: MAX_CONNECTIONS were open")


async def _always_ready() -> tuple[bool, str]:
    return True, "ok"


class OpsHttpServer:
    """*tls*: serve HTTPS with this identity (None: plain HTTP); *metrics_client_cert*: /metrics
    needs a client certificate signed by ``tls.ca_file``."""

    def __init__(self, host: str, port: int, readiness: Readiness | None = None, *,
                 tls: TlsConfig | None = None, metrics_client_cert: bool = False) -> None:
        self.host, self.port = host, port
        self._readiness = readiness or _always_ready
        self._runner: web.AppRunner | None = None
        if metrics_client_cert and not (tls and tls.ca_file):
            raise ConfigError("a client certificate for /metrics needs tls.ca_file")
        self._metrics_client_cert = metrics_client_cert
        # The handshake asks for a certificate only when /metrics needs one; probes go without.
        self._ssl = https_context(replace(tls, require_client_cert=False), optional_client_cert=metrics_client_cert) \
            if tls is not None else None

    @property
    def scheme(self) -> str:
        return "https" if self._ssl is not None else "http"

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        app.router.add_get("/ready", self._ready)
        self._runner = web.AppRunner(app, access_log=None, keepalive_timeout=HEADER_TIMEOUT_SEC)
        await self._runner.setup()
        site = GuardedSite(self._runner, self.host, self.port, max_connections=MAX_CONNECTIONS,
                           ssl_context=self._ssl, handshake_timeout=HEADER_TIMEOUT_SEC, refused=REFUSED.inc)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            raise ConfigError(bind_failure(self.host, self.port, "set server.metrics_port or free it",
                                           exc.strerror or "")) from exc
        self.port = site.port
        log.info("ops endpoint listening", extra={"address": f"{self.host}:{self.port}", "scheme": self.scheme})
        return self.port

    async def _metrics(self, request: web.Request) -> web.Response:
        if self._metrics_client_cert and not _peer_certificate(request):
            return web.json_response(
                {"error": "/metrics needs a client certificate signed by this fleet's CA (server.tls.ca_file); "
                          "configure the scraper's tls_config cert_file/key_file, or set server.ops_tls"},
                status=403)
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


def _peer_certificate(request: web.Request) -> bool:
    """Whether the connection presented a client certificate the server verified."""
    transport = request.transport
    return bool(transport is not None and transport.get_extra_info("peercert"))


def ops_server(server: ServerConfig, readiness: Readiness | None = None) -> OpsHttpServer | None:
    """The ops endpoint ``server`` asks for (None when ``metrics_port`` is unset), its transport
    chosen by ``server.ops_tls`` (see the module docstring)."""
    if server.metrics_port is None:
        return None
    tls = server.tls if server.tls.serves_tls and server.ops_tls != "plaintext" else None
    client_cert = tls is not None and server.ops_tls == "auto" and tls.require_client_cert
    return OpsHttpServer(server.host, server.metrics_port, readiness, tls=tls, metrics_client_cert=client_cert)
