"""Outbound client certificates follow their files (cert-manager style rotation), with real
certificates made here and a real mutual-TLS gRPC server that records the serial number of the
certificate each call's connection presented (and can refuse a "revoked" serial).

Every Motor program dials through ``motor_common.grpc_client.open_channel``, so this is the client
side of gateway → coordinator, controller → coordinators/nodemanagers, nodemanager → controller
and coordinator → controller.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from motor_common import certs
from motor_common.errors import ConfigError
from motor_common.grpc_client import open_channel
from motor_common.reloading_channel import ReloadingChannel
from motor_common.tls import TlsConfig, server_credentials
from tests.helpers import wait_for

HOSTS = ("127.0.0.1", "localhost")


def _serial(pem: bytes) -> int:
    return int(x509.load_pem_x509_certificate(pem).serial_number)


def _file_serial(path: Path) -> int:
    return _serial(path.read_bytes())


@dataclass
class Recorder(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """Health service that notes the client certificate serial of every call and refuses the
    serials in ``revoked`` (what a CRL / OCSP check at the server would do)."""

    seen: list[int] = field(default_factory=list)
    revoked: set[int] = field(default_factory=set)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    watch_serials: list[int] = field(default_factory=list)

    async def _who(self, context: grpc.aio.ServicerContext) -> int:
        pems = context.auth_context().get("x509_pem_cert") or []
        if not pems:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "no client certificate")
        serial = _serial(pems[0])
        if serial in self.revoked:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"certificate {serial} is revoked")
        return serial

    async def Check(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
                    ) -> health_pb2.HealthCheckResponse:
        self.seen.append(await self._who(context))
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
                    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        self.watch_serials.append(await self._who(context))
        yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
        await self.release.wait()
        yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.NOT_SERVING)


@dataclass
class Rig:
    port: int
    recorder: Recorder
    ca: certs.Ca
    dir: Path
    cert: Path  # the client's certificate and key as the client reads them (rotated in place)
    key: Path

    def client_tls(self) -> TlsConfig:
        return TlsConfig(cert_file=str(self.cert), key_file=str(self.key), ca_file=str(self.ca.cert_file))

    def issue(self, name: str, **kw: object) -> certs.Issued:
        return certs.issue(self.ca, self.dir / "issued", name, HOSTS, **kw)  # type: ignore[arg-type]

    def rotate(self, issued: certs.Issued, *, key: bool = True, cert: bool = True) -> None:
        """Write-then-rename, as cert-manager's kubelet volume or any careful tool does."""
        for src, dst, do in ((issued.cert_file, self.cert, cert), (issued.key_file, self.key, key)):
            if do:
                tmp = dst.with_suffix(".tmp")
                shutil.copy(src, tmp)
                os.replace(tmp, dst)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    ca = certs.make_ca(tmp_path / "ca")
    server = certs.issue(ca, tmp_path / "ca", "server", HOSTS)
    first = certs.issue(ca, tmp_path / "issued", "client-1", HOSTS)
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    shutil.copy(first.cert_file, cert)
    shutil.copy(first.key_file, key)
    recorder = Recorder()
    srv = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(recorder, srv)
    port = srv.add_secure_port("127.0.0.1:0", server_credentials(TlsConfig(
        cert_file=str(server.cert_file), key_file=str(server.key_file), ca_file=str(ca.cert_file),
        require_client_cert=True)))
    await srv.start()
    yield Rig(port, recorder, ca, tmp_path, cert, key)
    recorder.release.set()
    await srv.stop(0)


async def _check(stub: health_pb2_grpc.HealthStub) -> None:
    resp = await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


async def test_after_a_rotation_the_next_call_presents_the_new_certificate(rig: Rig) -> None:
    old_serial = _file_serial(rig.cert)
    async with open_channel(f"127.0.0.1:{rig.port}", tls=rig.client_tls()) as ch:
        assert isinstance(ch, ReloadingChannel)
        stub = health_pb2_grpc.HealthStub(ch)  # built once, like every Motor client
        await _check(stub)
        await _check(stub)
        assert rig.recorder.seen == [old_serial, old_serial]
        assert ch.reloads == 0  # unchanged files: same channel

        new = rig.issue("client-2")
        rig.rotate(new)
        rig.recorder.revoked.add(old_serial)  # the old certificate may no longer be used
        await _check(stub)  # the very next call
        assert rig.recorder.seen[-1] == _file_serial(new.cert_file) != old_serial
        assert ch.reloads == 1
        await _check(stub)
        assert rig.recorder.seen[-1] == _file_serial(new.cert_file)
        assert ch.reloads == 1


async def test_calls_in_flight_finish_on_the_old_connection_while_new_calls_use_the_new_certificate(rig: Rig) -> None:
    old_serial = _file_serial(rig.cert)
    async with open_channel(f"127.0.0.1:{rig.port}", tls=rig.client_tls()) as ch:
        assert isinstance(ch, ReloadingChannel)
        stub = health_pb2_grpc.HealthStub(ch)
        stream = stub.Watch(health_pb2.HealthCheckRequest())
        first = await stream.read()
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        assert rig.recorder.watch_serials == [old_serial]

        new = rig.issue("client-2")
        rig.rotate(new)
        await _check(stub)
        assert rig.recorder.seen == [_file_serial(new.cert_file)]
        assert ch.draining == 1  # the old channel still carries the stream

        rig.recorder.release.set()
        second = await stream.read()
        assert second.status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert await stream.code() == grpc.StatusCode.OK
        await wait_for(lambda: ch.draining == 0, timeout=15, what="the drained channel closed after its last call")
        await _check(stub)
        assert rig.recorder.seen[-1] == _file_serial(new.cert_file)


async def test_a_half_written_rotation_keeps_the_current_certificate(rig: Rig) -> None:
    old_serial = _file_serial(rig.cert)
    async with open_channel(f"127.0.0.1:{rig.port}", tls=rig.client_tls()) as ch:
        assert isinstance(ch, ReloadingChannel)
        stub = health_pb2_grpc.HealthStub(ch)
        new = rig.issue("client-2")
        rig.rotate(new, key=False)  # certificate written, key not yet: not a pair
        await _check(stub)
        await _check(stub)
        assert rig.recorder.seen == [old_serial, old_serial]
        assert ch.reloads == 0
        rig.rotate(new, cert=False)  # now the key
        await _check(stub)
        assert rig.recorder.seen[-1] == _file_serial(new.cert_file)
        assert ch.reloads == 1


async def test_an_expired_old_certificate_is_not_used_after_the_rotation(rig: Rig) -> None:
    # The first certificate expires a few seconds from now; the connection made with it keeps
    # working (TLS checks validity at the handshake), which is exactly why the client must open a
    # new connection with the new certificate instead of reusing it.
    now = dt.datetime.now(dt.UTC)
    short = rig.issue("short-lived", days=1, not_before=now - dt.timedelta(days=1) + dt.timedelta(seconds=4))
    rig.rotate(short)
    expires = x509.load_pem_x509_certificate(rig.cert.read_bytes()).not_valid_after_utc
    assert expires < now + dt.timedelta(seconds=30)
    async with open_channel(f"127.0.0.1:{rig.port}", tls=rig.client_tls()) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        await _check(stub)
        assert rig.recorder.seen == [_file_serial(short.cert_file)]
        new = rig.issue("client-2")
        rig.rotate(new)
        await wait_for(lambda: dt.datetime.now(dt.UTC) > expires, timeout=30, what="the old certificate expired")
        await _check(stub)
        assert rig.recorder.seen[-1] == _file_serial(new.cert_file)

    # The server really refuses the expired certificate on a new connection (raw credentials:
    # open_channel itself refuses to present an expired certificate).
    expired = TlsConfig(cert_file=str(short.cert_file), key_file=str(short.key_file), ca_file=str(rig.ca.cert_file))
    with pytest.raises(ConfigError, match="expired"):
        open_channel(f"127.0.0.1:{rig.port}", tls=expired)
    creds = grpc.ssl_channel_credentials(rig.ca.cert_file.read_bytes(), short.key_file.read_bytes(),
                                         short.cert_file.read_bytes())
    async with grpc.aio.secure_channel(f"127.0.0.1:{rig.port}", creds) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_close_ends_the_drained_channels_too(rig: Rig) -> None:
    ch = open_channel(f"127.0.0.1:{rig.port}", tls=rig.client_tls())
    assert isinstance(ch, ReloadingChannel)
    stub = health_pb2_grpc.HealthStub(ch)
    stream = stub.Watch(health_pb2.HealthCheckRequest())
    await stream.read()
    rig.rotate(rig.issue("client-2"))
    await _check(stub)
    assert ch.draining == 1
    await ch.close()
    assert ch.draining == 0
    with pytest.raises((grpc.aio.AioRpcError, asyncio.CancelledError)):
        await stream.read()


async def test_a_call_still_open_after_the_drain_time_is_cut_and_the_old_channel_closed(rig: Rig) -> None:
    from motor_common.grpc_client import _OPTIONS

    ch = ReloadingChannel(f"127.0.0.1:{rig.port}", rig.client_tls(), _OPTIONS, drain_sec=0.5)
    try:
        stub = health_pb2_grpc.HealthStub(ch)
        stream = stub.Watch(health_pb2.HealthCheckRequest())
        await stream.read()
        rig.rotate(rig.issue("client-2"))
        await _check(stub)
        await wait_for(lambda: ch.draining == 0, timeout=15, what="the drained channel closed at its drain time")
        with pytest.raises((grpc.aio.AioRpcError, asyncio.CancelledError)):
            await stream.read()
        await _check(stub)  # the current channel is untouched
    finally:
        await ch.close()
