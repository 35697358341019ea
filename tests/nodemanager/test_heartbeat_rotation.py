"""The nodemanager's heartbeat stream across a client-certificate rotation (real mTLS, real
certificates made here): the stream opened before the rotation keeps going on the old connection
until the drain time, then ends as a broken stream (Unavailable, which the heartbeat loop answers
by reconnecting) and never as a stray CancelledError that would end the loop; a stream opened
after the rotation runs on the new connection."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from motor_common import certs
from motor_common.errors import Unavailable
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as cgrpc
from motor_common.grpc_server import GrpcServer, ServerConfig
from motor_common.reloading_channel import ReloadingChannel
from motor_common.tls import TlsConfig
from motor_nodemanager.controller_client import GrpcController, HeartbeatFrame, NodeState
from tests.nodemanager.fake_controller import SERVICE, FakeController

KEY = "heartbeat-rotation-key"
HOSTS = ("127.0.0.1", "localhost")


async def frames(go: asyncio.Event, node: str) -> AsyncIterator[HeartbeatFrame]:
    yield HeartbeatFrame(node, NodeState.RUNNING, 0, ())
    while True:
        await go.wait()
        go.clear()
        yield HeartbeatFrame(node, NodeState.RUNNING, 0, ())


async def test_a_heartbeat_stream_outlives_the_rotation_until_the_drain_then_reconnects(tmp_path: Path) -> None:
    ca = certs.make_ca(tmp_path / "ca")
    server_cert = certs.issue(ca, tmp_path / "ca", "controller", HOSTS)
    first, second = (certs.issue(ca, tmp_path / "issued", n, HOSTS) for n in ("node-1", "node-2"))
    cert, key = tmp_path / "node.pem", tmp_path / "node.key"
    shutil.copy(first.cert_file, cert)
    shutil.copy(first.key_file, key)

    impl = FakeController()
    server = GrpcServer("fake-controller", ServerConfig(port=0, grace_seconds=0.1, tls=TlsConfig(
        cert_file=str(server_cert.cert_file), key_file=str(server_cert.key_file), ca_file=str(ca.cert_file),
        require_client_cert=True)), management_key=KEY)
    server.add_service(SERVICE, lambda s: cgrpc.add_ControllerServiceServicer_to_server(impl, s), protected=True)
    port = await server.start()
    ctl = GrpcController(f"127.0.0.1:{port}", KEY, tls=TlsConfig(cert_file=str(cert), key_file=str(key),
                                                               ca_file=str(ca.cert_file)))
    try:
        channel = ctl._channels[ctl.address]
        assert isinstance(channel, ReloadingChannel)
        channel.drain_sec = 1.0
        go_old = asyncio.Event()
        old = ctl.heartbeat(frames(go_old, "old"))
        assert (await asyncio.wait_for(anext(old), 15)).sequence == 1

        for src, dst in ((second.cert_file, cert), (second.key_file, key)):  # the rotation
            shutil.copy(src, dst.with_suffix(".tmp"))
            os.replace(dst.with_suffix(".tmp"), dst)
        go_new = asyncio.Event()
        new = ctl.heartbeat(frames(go_new, "new"))  # a new call: on a new channel
        assert (await asyncio.wait_for(anext(new), 15)).sequence == 1
        assert channel.reloads == 1 and channel.draining == 1

        go_old.set()  # the old stream still works during the drain
        assert (await asyncio.wait_for(anext(old), 15)).sequence == 2
        with pytest.raises(Unavailable) as cut:  # at the drain time: a broken stream, not a CancelledError
            await asyncio.wait_for(anext(old), 15)
        assert cut.value.reason == "CONNECTION_REOPENED"
        assert channel.draining == 0

        go_new.set()
        assert (await asyncio.wait_for(anext(new), 15)).sequence == 2
        await new.aclose()
    finally:
        await ctl.close()
        await server.stop(0)
