"""The ops endpoint (/metrics, /health, /ready) of the gRPC programs under TLS, with real
certificates made here and real HTTPS clients: ``server.ops_tls`` auto / https / plaintext."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from motor_common import certs
from motor_common.grpc_server import ServerConfig
from motor_common.ops_http import OpsHttpServer, ops_server
from motor_common.tls import TlsConfig

HOSTS = ("127.0.0.1", "localhost")


@dataclass
class Pki:
    ca: certs.Ca
    server: certs.Issued
    client: certs.Issued
    stranger: certs.Issued


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("ops-pki")
    ca = certs.make_ca(d / "ca")
    other = certs.make_ca(d / "other", name="another CA")
    return Pki(ca, certs.issue(ca, d / "ca", "server", HOSTS), certs.issue(ca, d / "ca", "prometheus", HOSTS),
               certs.issue(other, d / "other", "stranger", HOSTS))


def server_config(pki: Pki, *, ops_tls: str = "auto", mutual: bool = True, tls: bool = True) -> ServerConfig:
    identity = TlsConfig(cert_file=str(pki.server.cert_file), key_file=str(pki.server.key_file),
                         ca_file=str(pki.ca.cert_file), require_client_cert=mutual) if tls else TlsConfig()
    return ServerConfig(metrics_port=0, tls=identity, ops_tls=ops_tls)  # type: ignore[arg-type]


@asynccontextmanager
async def serving(config: ServerConfig) -> AsyncIterator[OpsHttpServer]:
    ops = ops_server(config)
    assert ops is not None
    await ops.start()
    try:
        yield ops
    finally:
        await ops.stop()


def client_ssl(pki: Pki, cert: certs.Issued | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert_file))
    if cert is not None:
        ctx.load_cert_chain(str(cert.cert_file), str(cert.key_file))
    return ctx


async def get(url: str, ctx: ssl.SSLContext | bool = True) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(url, ssl=ctx, timeout=aiohttp.ClientTimeout(total=10)) as r:
        return r.status, await r.text()


async def test_under_mutual_tls_metrics_needs_a_client_certificate_and_probes_do_not(pki: Pki) -> None:
    async with serving(server_config(pki)) as ops:
        assert ops.scheme == "https"
        base = f"https://127.0.0.1:{ops.port}"
        # kubelet-style probes: HTTPS, no client certificate
        assert await get(f"{base}/health", client_ssl(pki)) == (200, '{"status": "ok"}')
        assert (await get(f"{base}/ready", client_ssl(pki)))[0] == 200
        status, body = await get(f"{base}/metrics", client_ssl(pki))
        assert status == 403 and "client certificate" in body and "ops_tls" in body
        status, body = await get(f"{base}/metrics", client_ssl(pki, pki.client))
        assert status == 200 and "# TYPE" in body  # Prometheus exposition format
        # a certificate from another CA fails the handshake
        with pytest.raises(aiohttp.ClientError):
            await get(f"{base}/metrics", client_ssl(pki, pki.stranger))
        # plain HTTP to the HTTPS port gets nothing
        with pytest.raises(aiohttp.ClientError):
            await get(f"http://127.0.0.1:{ops.port}/health")
        # a client that does not trust the fleet CA refuses the ops port's certificate
        with pytest.raises(aiohttp.ClientError):
            await get(f"{base}/health", ssl.create_default_context())


async def test_server_only_tls_serves_every_route_over_https_without_client_certificates(pki: Pki) -> None:
    async with serving(server_config(pki, mutual=False)) as ops:
        base = f"https://127.0.0.1:{ops.port}"
        status, body = await get(f"{base}/metrics", client_ssl(pki))
        assert status == 200 and "# TYPE" in body


async def test_ops_tls_https_opens_metrics_to_scrapers_without_a_client_certificate(pki: Pki) -> None:
    async with serving(server_config(pki, ops_tls="https")) as ops:
        status, body = await get(f"https://127.0.0.1:{ops.port}/metrics", client_ssl(pki))
        assert status == 200 and "# TYPE" in body


@pytest.mark.parametrize("make", [
    lambda pki: server_config(pki, ops_tls="plaintext"),  # TLS on the gRPC port, plain ops port
    lambda pki: server_config(pki, tls=False),  # no TLS at all: plain HTTP as before
], ids=["plaintext-option", "no-tls"])
async def test_plain_http_ops(pki: Pki, make: Callable[[Pki], ServerConfig]) -> None:
    async with serving(make(pki)) as ops:
        assert ops.scheme == "http"
        status, body = await get(f"http://127.0.0.1:{ops.port}/metrics")
        assert status == 200 and "# TYPE" in body
        with pytest.raises(aiohttp.ClientError):
            await get(f"https://127.0.0.1:{ops.port}/health", client_ssl(pki))


def test_bad_ops_tls_settings_are_refused(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"ops_tls: https needs tls\.cert_file"):
        server_config(pki, ops_tls="https", tls=False)
    with pytest.raises(ValueError, match="ops_tls must be auto, https or plaintext"):
        server_config(pki, ops_tls="mtls")
    assert ops_server(ServerConfig()) is None  # no metrics_port: no ops endpoint
