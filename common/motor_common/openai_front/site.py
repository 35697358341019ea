"""The listening socket of the OpenAI front, with a bound on open connections.

aiohttp bounds a request head's size (``max_line_size``, ``max_field_size``, ``max_headers``) and,
through ``keepalive_timeout``, how long a connection may go without a complete head (its timer
runs from the connection's start and after each response; ``start_site`` sets it to
``limits.header_timeout_sec``). It has no bound on the number of connections: a client opening
hundreds and trickling bytes held them all. :class:`GuardedSite` answers a connection beyond
``max_connections`` with a 503 OpenAI error and closes it before aiohttp sees it.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from motor_common.openai_front import metrics
from motor_common.openai_front.openai import HttpError

# The Server header of every gateway response: aiohttp's default names the Python and aiohttp
# versions, which helps nobody but someone matching known vulnerabilities.
SERVER_HEADER = "motor-gateway"

_BUSY_BODY = HttpError(503, "too many open connections to this server; retry later",
                       "service_unavailable_error", "too_many_connections").json()
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
    b"Retry-After: 1\r\nContent-Length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY
)


class _Busy(asyncio.Protocol):
    """A connection over the limit: the 503 is written and the connection closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        metrics.CONNECTIONS_REFUSED.inc()
        if isinstance(transport, asyncio.WriteTransport):
            transport.write(BUSY_RESPONSE)
        transport.close()


class ProtocolLog(logging.Logger):
    """aiohttp's connection logger: a malformed request (bad header bytes, over-long line, broken
    chunking) is the client's fault, logged as one line without a traceback; aiohttp answers it
    with a plain-text 400 before any route runs."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        detail = exc_info if isinstance(exc_info, BaseException) else None
        self.info("%s: %s", str(msg) % args if args else msg, str(detail or "").strip().replace("\n", " "))


PROTOCOL_LOG = ProtocolLog("motor_gateway.http")
PROTOCOL_LOG.parent = logging.getLogger("motor_gateway")


class _Handler(RequestHandler):
    """aiohttp's connection handler whose answers to malformed requests (before any route: bad
    header bytes, over-long lines, broken chunking) are OpenAI error objects, not plain text."""

    __slots__ = ()

    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs (ProtocolLog), may raise
        if status >= 500:
            err = HttpError(status, "internal error", "server_error", "internal_error")
        else:
            err = HttpError(status, "malformed HTTP request: check the request line, header names and "
                            "values (visible ASCII), and the body framing", "invalid_request_error", "bad_request")
        resp = web.Response(status=status, body=err.json(), content_type="application/json")
        resp.headers["Server"] = SERVER_HEADER
        resp.force_close()
        return resp


def _handler(server: web.Server) -> asyncio.Protocol:
    kwargs = getattr(server, "_kwargs", None)
    if kwargs is None:  # another aiohttp: its own handler, plain-text errors
        return server()
    return _Handler(server, loop=asyncio.get_running_loop(), **kwargs)


class GuardedSite(web.BaseSite):
    """``web.TCPSite`` with at most *max_connections* open client connections."""

    __slots__ = ("_host", "_max_connections", "_port", "_reuse_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, max_connections: int,
                 reuse_port: bool = False, ssl_context: ssl.SSLContext | None = None,
                 backlog: int = 1024) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host = host
        self._port = port
        self._max_connections = max_connections
        self._reuse_port = reuse_port

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self.port}"

    @property
    def port(self) -> int:
        sockets = getattr(self._server, "sockets", None)
        return int(sockets[0].getsockname()[1]) if sockets else self._port

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        limit = self._max_connections

        def protocol() -> asyncio.Protocol:
            if len(server.connections) >= limit:
                return _Busy()
            return _handler(server)

        self._server = await asyncio.get_running_loop().create_server(
            protocol, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog,
            reuse_address=True, reuse_port=self._reuse_port or None,
        )
