"""The gateway's channel to the coordinator across a client-certificate rotation (real mTLS fake
coordinator, certificates made here): a completion streaming when the certificate is rotated keeps
streaming on the old connection during the drain; one still open at the drain time ends as a
503 ``coordinator_unreachable`` for that client (not a stray cancellation); new requests use the
new certificate's channel."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from motor_common import certs
from motor_common.openai_front.dispatch import DispatchFailed
from motor_common.reloading_channel import ReloadingChannel
from motor_common.tls import TlsConfig
from motor_gateway.client import GrpcDispatchClient
from motor_gateway.pool import CoordinatorPool
from tests.gateway.fakes import chunk, fake_coordinator, hanging, head

HOSTS = ("127.0.0.1", "localhost")


async def test_a_stream_open_at_the_drain_time_is_a_503_not_a_cancellation(tmp_path: Path) -> None:
    ca = certs.make_ca(tmp_path / "ca")
    server = certs.issue(ca, tmp_path / "ca", "coordinator", HOSTS)
    first, second = (certs.issue(ca, tmp_path / "issued", n, HOSTS) for n in ("gateway-1", "gateway-2"))
    cert, key = tmp_path / "gateway.pem", tmp_path / "gateway.key"
    shutil.copy(first.cert_file, cert)
    shutil.copy(first.key_file, key)
    server_tls = TlsConfig(cert_file=str(server.cert_file), key_file=str(server.key_file),
                           ca_file=str(ca.cert_file), require_client_cert=True)
    async with fake_coordinator(server_tls) as (addr, fake):
        fake.script = hanging(head(200, "text/event-stream"), chunk(b"data: 1\n\n"))
        pool = CoordinatorPool([addr], tls=TlsConfig(cert_file=str(cert), key_file=str(key),
                                                     ca_file=str(ca.cert_file)))
        client = GrpcDispatchClient(pool, request_timeout=60, control_timeout=10)
        try:
            channel = pool._members[addr].channel
            assert isinstance(channel, ReloadingChannel)
            channel.drain_sec = 1.0
            stream = await client.dispatch("rid-rotation", "completions", b'{"model": "tiny", "prompt": "x"}',
                                           {"model": "tiny", "prompt": "x"})
            chunks = stream.chunks()
            assert await asyncio.wait_for(anext(chunks), 15) == b"data: 1\n\n"

            for src, dst in ((second.cert_file, cert), (second.key_file, key)):
                shutil.copy(src, dst.with_suffix(".tmp"))
                os.replace(dst.with_suffix(".tmp"), dst)
            assert [m.id for m in await client.models("rid-models")] == ["tiny"]  # a new call: new channel
            assert channel.reloads == 1 and channel.draining == 1

            with pytest.raises(DispatchFailed) as cut:
                await asyncio.wait_for(anext(chunks), 15)
            assert (cut.value.error.status, cut.value.error.code) == (503, "coordinator_unreachable")
            assert channel.draining == 0
            fake.script = hanging(head(200, "application/json"), chunk(b'{"ok": true}'))
            again = await client.dispatch("rid-after", "completions", b'{"model": "tiny", "prompt": "y"}',
                                          {"model": "tiny", "prompt": "y"})
            assert again.head.status == 200
            await again.aclose()
        finally:
            await pool.close()
