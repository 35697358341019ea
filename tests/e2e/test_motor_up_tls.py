"""`motor up --tls`: the whole managed fleet with mutual TLS on every gRPC channel and HTTPS on the
gateway, from a throw-away CA made at start-up.

The fleet becoming ready proves every channel works with mTLS (nodemanagers → controller register
and heartbeat, controller → nodemanagers start engines, controller → coordinator pushes instances,
gateway → coordinator dispatches). Then: the openai SDK over HTTPS, `motor status` against it, and
gRPC clients without a certificate, with one from another CA, or in plaintext are refused.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from motor_common import certs
from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as pbg
from motor_common.grpc_client import call_metadata, open_channel
from motor_common.tls import TlsConfig
from tests.conftest import tool
from tests.motor_up import UpFleet, motor_up

pytestmark = pytest.mark.slow


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[UpFleet]:
    async with motor_up(tmp_path, "--tls", "--zero-latency", timeout=120) as up:
        yield up


async def _list_nodes(address: str, key: str, tls: TlsConfig | None) -> int:
    async with open_channel(address, tls=tls) as ch:
        resp = await pbg.ControllerAdminServiceStub(ch).ListNodes(
            pb.ListNodesRequest(), metadata=call_metadata(key), timeout=5)
        return len(resp.nodes)


async def test_motor_up_tls_runs_the_fleet_with_mutual_tls(fleet: UpFleet, tmp_path: Path) -> None:
    info = fleet.info
    assert info["gateway_url"].startswith("https://")
    tls = TlsConfig(**info["tls"])
    assert tls.ca_file and tls.cert_file
    for spec in (fleet.state / "controller.yaml", fleet.state / "coordinator.yaml"):
        assert "require_client_cert: true" in spec.read_text()

    # The OpenAI front over HTTPS, verified against the fleet CA.
    verify = ssl.create_default_context(cafile=tls.ca_file)
    async with openai.DefaultAsyncHttpxClient(verify=verify) as http:
        client = openai.AsyncOpenAI(base_url=info["gateway_url"] + "/v1", api_key="unused",
                                    max_retries=0, timeout=10, http_client=http)
        resp = await client.completions.create(model="tiny", prompt="Hello over TLS", max_tokens=4)
        assert resp.choices[0].text and resp.usage is not None and resp.usage.completion_tokens == 4
    # Without the fleet CA the SDK refuses the gateway's certificate.
    untrusting = openai.AsyncOpenAI(base_url=info["gateway_url"] + "/v1", api_key="unused", max_retries=0, timeout=10)
    with pytest.raises(openai.APIConnectionError):
        await untrusting.completions.create(model="tiny", prompt="x", max_tokens=1)
    # Plain HTTP to the HTTPS port gets no completion.
    plain = info["gateway_url"].replace("https://", "http://")
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await session.post(plain + "/v1/completions", json={"model": "tiny", "prompt": "x"},
                               timeout=aiohttp.ClientTimeout(total=5))

    # `motor status` finds the CLI certificate through fleet.json.
    status = subprocess.run([tool("motor"), "status", "--state-dir", str(fleet.state), "--json"],
                            capture_output=True, text=True, timeout=30, check=True)
    view = json.loads(status.stdout)
    assert sorted(i["role"] for i in view["instances"] if i["state"] == "active") == ["decode", "prefill"]

    key = Path(info["management_key_file"]).read_text().strip()
    assert await _list_nodes(info["controller"], key, tls) == 2
    stranger_ca = certs.make_ca(tmp_path / "stranger")
    stranger = certs.issue(stranger_ca, tmp_path / "stranger", "intruder")
    refused = {
        "plaintext": None,
        "no client certificate": TlsConfig(ca_file=tls.ca_file),
        "certificate from another CA": TlsConfig(cert_file=str(stranger.cert_file), key_file=str(stranger.key_file),
                                                 ca_file=tls.ca_file),
    }
    for who, creds in refused.items():
        for address in (info["controller"], info["coordinators"][0]):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _list_nodes(address, key, creds)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, (who, address)

    # The ops ports (/metrics, /health, /ready) of the gRPC programs are HTTPS too; `motor status`
    # lists them; probes need no client certificate, /metrics needs one from the fleet CA.
    programs = view["programs"]
    assert {p["kind"] for p in programs.values()} == {"controller", "coordinator", "nodemanager", "gateway"}
    probe = ssl.create_default_context(cafile=tls.ca_file)
    scraper = ssl.create_default_context(cafile=tls.ca_file)
    assert tls.cert_file and tls.key_file
    scraper.load_cert_chain(tls.cert_file, tls.key_file)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for name, urls in programs.items():
            assert all(u and u.startswith("https://") for u in (urls["metrics"], urls["health"], urls["ready"])), urls
            async with session.get(urls["ready"], ssl=probe) as r:
                assert r.status == 200, (name, await r.text())
            async with session.get(urls["metrics"], ssl=scraper) as r:
                assert r.status == 200 and "# TYPE" in await r.text(), name
            if urls["kind"] == "gateway":
                continue  # the OpenAI front's own /metrics: HTTPS, no client certificate (docs/security.md)
            async with session.get(urls["metrics"], ssl=probe) as r:
                assert r.status == 403, name
            with pytest.raises(aiohttp.ClientError):
                await session.get(urls["health"].replace("https://", "http://"))

    # Rotating the gateway's certificate (same CA, renamed over the files as cert-manager does):
    # its HTTPS front serves the new one at the next handshake and its channel to the coordinator
    # presents the new one from the next call on, without a restart.
    d = fleet.state / "tls"
    ca = certs.Ca(d / "ca.pem", d / "ca.key", x509.load_pem_x509_certificate((d / "ca.pem").read_bytes()),
                  serialization.load_pem_private_key((d / "ca.key").read_bytes(), None))  # type: ignore[arg-type]
    old_serial = x509.load_pem_x509_certificate((d / "gateway.pem").read_bytes()).serial_number
    fresh = certs.issue(ca, tmp_path / "rotated", "gateway", ["127.0.0.1", "localhost"])
    for src, dst in ((fresh.cert_file, d / "gateway.pem"), (fresh.key_file, d / "gateway.key")):
        tmp = dst.with_suffix(".new")
        tmp.write_bytes(src.read_bytes())
        tmp.replace(dst)
    new_serial = x509.load_pem_x509_certificate((d / "gateway.pem").read_bytes()).serial_number
    assert new_serial != old_serial
    async with openai.DefaultAsyncHttpxClient(verify=ssl.create_default_context(cafile=tls.ca_file)) as http:
        client = openai.AsyncOpenAI(base_url=info["gateway_url"] + "/v1", api_key="unused",
                                    max_retries=0, timeout=10, http_client=http)
        resp = await client.completions.create(model="tiny", prompt="after the rotation", max_tokens=2)
        assert resp.usage is not None and resp.usage.completion_tokens == 2
    host, port = info["gateway_url"].removeprefix("https://").rsplit(":", 1)
    _, writer = await asyncio.open_connection(host, int(port), ssl=ssl.create_default_context(cafile=tls.ca_file))
    served = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    assert x509.load_der_x509_certificate(served).serial_number == new_serial
    gateway_log = (fleet.state / "logs" / "gateway.log").read_text(errors="replace")
    assert "client TLS certificate reloaded" in gateway_log
