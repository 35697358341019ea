"""TLS and mutual TLS of the gRPC chassis and the HTTPS context, with real certificates made here.

A real GrpcServer serves health; clients with a certificate from the fleet CA get through, clients
without a certificate or with one from another CA are refused; rotating the server's certificate
files is picked up at the next handshake without a restart (a client that trusts only the new CA
connects after the rotation, and a half-written rotation keeps the old certificate).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
import pytest
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc

from motor_common import certs
from motor_common.errors import ConfigError
from motor_common.grpc_client import open_channel
from motor_common.grpc_server import GrpcServer, ServerConfig
from motor_common.tls import TlsConfig, https_context

HOSTS = ("127.0.0.1", "localhost")


@dataclass
class Pki:
    ca: certs.Ca
    other_ca: certs.Ca
    server: certs.Issued
    client: certs.Issued
    stranger: certs.Issued  # signed by other_ca
    dir: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca = certs.make_ca(d / "ca")
    other = certs.make_ca(d / "other", name="some other CA")
    return Pki(ca, other, certs.issue(ca, d / "ca", "server", HOSTS), certs.issue(ca, d / "ca", "client", HOSTS),
               certs.issue(other, d / "other", "stranger", HOSTS), d)


def _server_tls(pki: Pki, tmp: Path, *, mutual: bool = True) -> TlsConfig:
    """Copies of the server's files (so a test can rotate them)."""
    cert, key = tmp / "server.pem", tmp / "server.key"
    shutil.copy(pki.server.cert_file, cert)
    shutil.copy(pki.server.key_file, key)
    return TlsConfig(cert_file=str(cert), key_file=str(key), ca_file=str(pki.ca.cert_file), require_client_cert=mutual)


@pytest.fixture
async def mtls_server(pki: Pki, tmp_path: Path) -> AsyncIterator[tuple[int, TlsConfig]]:
    tls = _server_tls(pki, tmp_path)
    server = GrpcServer("tls-test", ServerConfig(tls=tls))
    port = await server.start()
    yield port, tls
    await server.stop(0)


async def _check(port: int, tls: TlsConfig | None) -> int:
    async with open_channel(f"127.0.0.1:{port}", tls=tls) as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return int(resp.status)


def _client(pki: Pki, issued: certs.Issued | None, ca: Path | None = None) -> TlsConfig:
    return TlsConfig(cert_file=str(issued.cert_file) if issued else None,
                     key_file=str(issued.key_file) if issued else None,
                     ca_file=str(ca or pki.ca.cert_file))


async def test_mtls_serves_a_client_with_a_certificate_from_the_ca(mtls_server: tuple[int, TlsConfig], pki: Pki) -> None:
    port, _ = mtls_server
    assert await _check(port, _client(pki, pki.client)) == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("who", ["no certificate", "certificate from another CA", "plaintext"])
async def test_mtls_refuses_clients_without_a_valid_certificate(
    mtls_server: tuple[int, TlsConfig], pki: Pki, who: str
) -> None:
    port, _ = mtls_server
    tls = {"no certificate": _client(pki, None), "certificate from another CA": _client(pki, pki.stranger),
           "plaintext": None}[who]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _check(port, tls)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_client_refuses_a_server_signed_by_another_ca(mtls_server: tuple[int, TlsConfig], pki: Pki) -> None:
    port, _ = mtls_server
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _check(port, _client(pki, pki.client, ca=pki.other_ca.cert_file))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_server_only_tls_needs_no_client_certificate(pki: Pki, tmp_path: Path) -> None:
    server = GrpcServer("tls-test", ServerConfig(tls=_server_tls(pki, tmp_path, mutual=False)))
    port = await server.start()
    try:
        assert await _check(port, _client(pki, None)) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError):
            await _check(port, None)  # plaintext to a TLS port
    finally:
        await server.stop(0)


async def test_the_older_tls_cert_file_keys_still_serve_tls(pki: Pki) -> None:
    cfg = ServerConfig(tls_cert_file=str(pki.server.cert_file), tls_key_file=str(pki.server.key_file))
    assert cfg.tls.cert_file == str(pki.server.cert_file)
    server = GrpcServer("tls-test", cfg)
    port = await server.start()
    try:
        assert await _check(port, _client(pki, None)) == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(0)


def _rotate_to(tls: TlsConfig, issued: certs.Issued) -> None:
    """Replace the server's files (new mtime and content), as a cert-manager would."""
    assert tls.cert_file and tls.key_file
    for src, dst in ((issued.cert_file, tls.cert_file), (issued.key_file, tls.key_file)):
        tmp = dst + ".new"
        shutil.copy(src, tmp)
        os.replace(tmp, dst)
        st = os.stat(dst)
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


async def test_grpc_server_certificate_is_reloaded_without_restart(pki: Pki, tmp_path: Path) -> None:
    # Server-only TLS so the trust decision is the client's: a client trusting only the new CA
    # fails before the rotation and connects after it, on the same running server.
    tls = _server_tls(pki, tmp_path, mutual=False)
    server = GrpcServer("tls-test", ServerConfig(tls=tls))
    port = await server.start()
    try:
        new = certs.issue(pki.other_ca, pki.dir / "rotated", "server-v2", HOSTS)
        trusts_new = TlsConfig(ca_file=str(pki.other_ca.cert_file))
        with pytest.raises(grpc.aio.AioRpcError):
            await _check(port, trusts_new)
        _rotate_to(tls, new)
        assert await _check(port, trusts_new) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError):
            await _check(port, _client(pki, None))  # the old certificate is gone
    finally:
        await server.stop(0)


async def test_a_mismatched_rotation_keeps_the_old_certificate(pki: Pki, tmp_path: Path) -> None:
    tls = _server_tls(pki, tmp_path, mutual=False)
    server = GrpcServer("tls-test", ServerConfig(tls=tls))
    port = await server.start()
    try:
        assert tls.cert_file
        other = certs.issue(pki.other_ca, pki.dir / "half", "half", HOSTS)
        shutil.copy(other.cert_file, tls.cert_file)  # the certificate changed, its key not yet
        assert await _check(port, _client(pki, None)) == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(0)



def _expired(pki: Pki) -> certs.Issued:
    """A certificate from the fleet CA that expired a day ago (an old backup, a stalled renewal)."""
    start = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
    return certs.issue(pki.ca, pki.dir / "expired", "expired", HOSTS, days=9, not_before=start)


async def test_a_rotation_to_an_expired_certificate_keeps_the_current_one(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """An expired certificate renamed over the served one is not loaded: clients keep getting the
    valid one (they would refuse an expired one), the log says why, nothing restarts."""
    tls = _server_tls(pki, tmp_path, mutual=False)
    server = GrpcServer("tls-test", ServerConfig(tls=tls))
    port = await server.start()
    try:
        _rotate_to(tls, _expired(pki))
        assert await _check(port, _client(pki, None)) == health_pb2.HealthCheckResponse.SERVING
        assert "expired" in caplog.text and "keeping the current certificate" in caplog.text
    finally:
        await server.stop(0)
    with pytest.raises(ConfigError, match="expired"):  # and a program does not start with one
        https_context(TlsConfig(cert_file=str(_expired(pki).cert_file), key_file=str(_expired(pki).key_file)))

def test_missing_or_mismatched_files_are_config_errors(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read TLS"):
        https_context(TlsConfig(cert_file=str(tmp_path / "nope.pem"), key_file=str(tmp_path / "nope.key")))
    with pytest.raises(ConfigError, match="do not form a valid pair"):
        https_context(TlsConfig(cert_file=str(pki.server.cert_file), key_file=str(pki.client.key_file)))
    with pytest.raises(ValueError, match="require_client_cert needs"):
        TlsConfig(cert_file="a", key_file="b", require_client_cert=True)


async def _https_site(ctx: ssl.SSLContext) -> tuple[web.AppRunner, int]:
    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="hello")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    return runner, int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]


async def _get(port: int, ca: Path, client: certs.Issued | None = None) -> str:
    ctx = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        ctx.load_cert_chain(str(client.cert_file), str(client.key_file))
    async with aiohttp.ClientSession() as http:
        async with http.get(f"https://127.0.0.1:{port}/", ssl=ctx, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            return await resp.text()


async def test_https_context_serves_and_reloads_its_certificate(pki: Pki, tmp_path: Path) -> None:
    tls = _server_tls(pki, tmp_path, mutual=False)
    runner, port = await _https_site(https_context(tls))
    try:
        assert await _get(port, pki.ca.cert_file) == "hello"
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await _get(port, pki.other_ca.cert_file)
        _rotate_to(tls, certs.issue(pki.other_ca, pki.dir / "https-rotated", "server-v2", HOSTS))
        assert await _get(port, pki.other_ca.cert_file) == "hello"
    finally:
        await runner.cleanup()


async def test_https_with_client_certificates_refuses_strangers(pki: Pki, tmp_path: Path) -> None:
    runner, port = await _https_site(https_context(_server_tls(pki, tmp_path, mutual=True)))
    try:
        assert await _get(port, pki.ca.cert_file, pki.client) == "hello"
        for who in (None, pki.stranger):
            with pytest.raises(aiohttp.ClientError):
                await _get(port, pki.ca.cert_file, who)
    finally:
        await runner.cleanup()


async def test_files_that_cannot_be_loaded_are_warned_about_once_not_at_every_handshake(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A half-written rotation that stays on disk: every new handshake (gRPC and HTTPS) is served
    with the current certificate, the files are reported once (not once per connection), and the
    completed rotation is loaded."""
    (tmp_path / "grpc").mkdir()
    (tmp_path / "https").mkdir()
    grpc_tls = _server_tls(pki, tmp_path / "grpc", mutual=False)
    https_tls = _server_tls(pki, tmp_path / "https", mutual=False)
    server = GrpcServer("tls-test", ServerConfig(tls=grpc_tls))
    port = await server.start()
    runner, https_port = await _https_site(https_context(https_tls))
    refused = "TLS files changed but cannot be loaded"
    try:
        half = certs.issue(pki.other_ca, pki.dir / "half-written", "half-written", HOSTS)
        for tls in (grpc_tls, https_tls):
            assert tls.cert_file
            shutil.copy(half.cert_file, tls.cert_file)  # the certificate changed, its key not
        for _ in range(3):
            assert await _check(port, _client(pki, None)) == health_pb2.HealthCheckResponse.SERVING
            assert await _get(https_port, pki.ca.cert_file) == "hello"
        assert caplog.text.count(refused) == 2  # one for each server
        _rotate_to(grpc_tls, half)
        _rotate_to(https_tls, half)
        assert await _check(port, TlsConfig(ca_file=str(pki.other_ca.cert_file))) == health_pb2.HealthCheckResponse.SERVING
        assert await _get(https_port, pki.other_ca.cert_file) == "hello"
    finally:
        await runner.cleanup()
        await server.stop(0)
