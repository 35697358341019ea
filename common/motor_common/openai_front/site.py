"""The listening socket of the OpenAI front, with a bound on open connections.

aiohttp bounds a request head's size (``max_line_size``, ``max_field_size``, ``max_headers``) and,
through ``keepalive_timeout``, how long a connection may go without a complete head (its timer
runs from the connection's start and after each response; ``start_site`` sets it to
``limits.header_timeout_sec``). It has no bound on the number of connections: a client opening
hundreds and trickling bytes held them all. :class:`GuardedSite` counts a connection from its
accept to its close and answers one beyond ``max_connections`` with a 503 OpenAI error (HTTPS: a
close, before any handshake work) before aiohttp sees it.

The count is kept by the site, not read from aiohttp: aiohttp registers a connection only in
``connection_made``, which asyncio runs after the protocol factory of every connection of an
accept burst (so a burst of hundreds all passed a check of ``len(server.connections)``) and, for
TLS, only once the handshake is done (a client that never sends a ClientHello was never counted).
An HTTPS connection's handshake is bounded by the site's *handshake_timeout* (asyncio's default
is 60 s).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from asyncio import sslproto
from collections.abc import Callable
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

    def __init__(self, refused: Callable[[], None]) -> None:
        self._refused = refused

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._refused()
        if isinstance(transport, asyncio.WriteTransport):
            transport.write(BUSY_RESPONSE)
        transport.close()


class _Refused(asyncio.Protocol):
    """An HTTPS connection over the limit: closed before any handshake work."""

    def __init__(self, refused: Callable[[], None]) -> None:
        self._refused = refused

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._refused()
        transport.close()


class _Count:
    """A site's open client connections, counted from their accept to their close."""

    __slots__ = ("limit", "open")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0

    def take(self) -> bool:
        if self.open >= self.limit:
            return False
        self.open += 1
        return True

    def give_back(self) -> None:
        self.open -= 1


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

    __slots__ = ("_on_lost",)

    def __init__(self, server: web.Server, on_lost: Callable[[], None] | None, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self._on_lost = on_lost

    def connection_lost(self, exc: BaseException | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            if self._on_lost is not None:
                self._on_lost()

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


def _handler(server: web.Server, on_lost: Callable[[], None] | None) -> _Handler:
    # the handler web.Server.__call__ makes, with the server's settings (aiohttp >= 3.14 is required)
    return _Handler(server, on_lost, loop=asyncio.get_running_loop(), **server._kwargs)


class _TlsConnection(sslproto.SSLProtocol):
    """The TLS layer of one HTTPS connection (what asyncio builds for ``create_server(ssl=...)``),
    made by the site so that the connection is given back to the count when the socket closes:
    asyncio tells the application protocol nothing of a handshake that fails or times out."""

    def __init__(self, app: asyncio.BaseProtocol, context: ssl.SSLContext, handshake_timeout: float,
                 on_lost: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()  # nobody waits on the handshake: the app protocol is told
        waiter.add_done_callback(lambda f: f.cancelled() or f.exception())  # mark a failure retrieved
        super().__init__(loop, app, context, waiter, server_side=True,
                         ssl_handshake_timeout=handshake_timeout)  # type: ignore[arg-type]  # a float works
        self._on_lost = on_lost

    def connection_lost(self, exc: BaseException | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            self._on_lost()


class GuardedSite(web.BaseSite):
    """``web.TCPSite`` with at most *max_connections* open client connections, counted from their
    accept, and TLS handshakes bounded by *handshake_timeout* seconds. *refused*: counts a
    connection turned away (default: the front's ``motor_gateway_connections_refused_total``)."""

    __slots__ = ("_handshake_timeout", "_host", "_max_connections", "_port", "_refused", "_reuse_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, max_connections: int,
                 reuse_port: bool = False, ssl_context: ssl.SSLContext | None = None,
                 handshake_timeout: float = 10.0, backlog: int = 1024,
                 refused: Callable[[], None] | None = None) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host = host
        self._port = port
        self._max_connections = max_connections
        self._handshake_timeout = handshake_timeout
        self._reuse_port = reuse_port
        self._refused = refused or metrics.CONNECTIONS_REFUSED.inc

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
        count = _Count(self._max_connections)
        context, timeout, refused = self._ssl_context, self._handshake_timeout, self._refused

        # Called by asyncio for each accepted socket, before any byte is read: counted here.
        def protocol() -> asyncio.BaseProtocol:
            if not count.take():
                return _Busy(refused) if context is None else _Refused(refused)
            if context is None:
                return _handler(server, count.give_back)
            return _TlsConnection(_handler(server, None), context, timeout, count.give_back)

        self._server = await asyncio.get_running_loop().create_server(
            protocol, self._host, self._port, backlog=self._backlog,
            reuse_address=True, reuse_port=self._reuse_port or None,
        )
