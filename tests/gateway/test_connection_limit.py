"""``limits.max_connections`` of the OpenAI front's listening socket (``GuardedSite``) against
connections opened all at once, over plain HTTP and HTTPS: a connection is counted from its
accept (not from aiohttp's ``connection_made``, which comes after a whole accept burst and, for
TLS, after the handshake), the ones over the limit are closed at once, a silent TLS client is
closed after the handshake timeout, and every closed connection gives its place back."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from motor_common import certs
from motor_common.openai_front.app import start_site
from motor_common.openai_front.limits import HttpLimits
from tests.helpers import wait_for

LIMIT = 4


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[certs.Ca, certs.Issued]:
    d = tmp_path_factory.mktemp("site-pki")
    ca = certs.make_ca(d / "ca")
    return ca, certs.issue(ca, d / "ca", "server", ("127.0.0.1", "localhost"))


Site = Callable[..., AbstractAsyncContextManager[int]]


@pytest.fixture
def site(pki: tuple[certs.Ca, certs.Issued]) -> Site:
    """``site(tls=..., header_timeout=...)``: a front's listening socket serving ``GET /health``."""
    _, server = pki

    @asynccontextmanager
    async def serve(*, tls: bool, header_timeout: float) -> AsyncIterator[int]:
        async def health(_request: web.Request) -> web.Response:
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/health", health)
        ctx = None
        if tls:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(str(server.cert_file), str(server.key_file))
        limits = HttpLimits(max_connections=LIMIT, header_timeout_sec=header_timeout)
        runner, port = await start_site(app, "127.0.0.1", 0, shutdown_timeout=1.0, limits=limits, ssl_context=ctx)
        try:
            yield port
        finally:
            await runner.cleanup()
    return serve


def burst(port: int, n: int) -> list[socket.socket]:
    """*n* connections started at once (non-blocking connects: the kernel completes them all into
    the listen backlog before the server's loop runs again); nothing is sent on them."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        socks.append(s)
    return socks


def closed_by_server(s: socket.socket) -> bool:
    """Whether the server has closed *s* (reading what it sent first: the 503)."""
    while True:
        try:
            if not s.recv(65536, socket.MSG_DONTWAIT):
                return True
        except BlockingIOError:
            return False
        except OSError:  # reset
            return True


async def served(port: int, ca: certs.Ca | None) -> bool:
    ctx: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca.cert_file)) if ca else False
    scheme = "https" if ca else "http"
    try:
        async with aiohttp.ClientSession() as http, http.get(
                f"{scheme}://127.0.0.1:{port}/health", ssl=ctx, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


def count_closed(socks: list[socket.socket]) -> int:
    return sum(closed_by_server(s) for s in socks)


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
async def test_a_burst_of_connections_keeps_at_most_the_limit_open(
        site: Site, pki: tuple[certs.Ca, certs.Issued], tls: bool) -> None:
    async with site(tls=tls, header_timeout=60.0) as port:
        socks = burst(port, 40)
        try:
            # the ones over the limit are closed at once; the first LIMIT are held (silent, within
            # the 60 s header/handshake timeout)
            await wait_for(lambda: count_closed(socks) >= 40 - LIMIT, timeout=30,
                           what=f"the server closing the {40 - LIMIT} connections over the limit")
            assert count_closed(socks) == 40 - LIMIT
            assert not await served(port, pki[0] if tls else None)  # the limit holds for a real client too
        finally:
            for s in socks:
                s.close()
        # closing them (for TLS: mid-handshake) gives their places back
        await wait_for(lambda: served(port, pki[0] if tls else None), timeout=30,
                       what="a client served once the held connections are gone")


async def test_a_silent_tls_client_is_closed_after_the_handshake_timeout(
        site: Site, pki: tuple[certs.Ca, certs.Issued]) -> None:
    async with site(tls=True, header_timeout=1.0) as port:
        started = time.monotonic()
        socks = burst(port, LIMIT)  # TCP connections that never send a ClientHello
        try:
            await wait_for(lambda: count_closed(socks) == LIMIT, timeout=30,
                           what="the silent TLS connections closed by the server")
            assert time.monotonic() - started >= 1.0 - 0.05  # ...by the timeout, not before
            # and their places are given back
            await wait_for(lambda: served(port, pki[0]), timeout=30, what="a TLS client served")
        finally:
            for s in socks:
                s.close()


async def test_the_count_follows_connections_that_come_and_go(site: Site) -> None:
    async with site(tls=False, header_timeout=60.0) as port:
        for _ in range(3 * LIMIT):  # sequential clients: each closes before the next
            assert await served(port, None)
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(LIMIT)]
        try:
            assert not await served(port, None)
        finally:
            for _, w in held:
                w.close()
        await wait_for(lambda: served(port, None), timeout=30, what="served again")
