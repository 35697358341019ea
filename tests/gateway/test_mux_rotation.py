"""The gateway's DispatchMany stream across a client-certificate rotation, against a real
coordinator serving mutual TLS and a real simulated engine (certificates made here).

After the rotation the next request opens a new stream on a new connection (the new certificate);
a request still open on the old stream finishes there, then the old stream is half-closed and its
connection closed; a request still open at the drain time fails like a broken stream (and the
gateway keeps serving), never hangs."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from motor_common import certs
from motor_common.domain import EngineType, Role
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_client import open_channel
from motor_common.grpc_server import ServerConfig
from motor_common.openai_front.dispatch import DispatchFailed, DispatchStream
from motor_common.reloading_channel import ReloadingChannel
from motor_common.tls import TlsConfig
from motor_coordinator.app import Coordinator
from motor_coordinator.config import CoordinatorConfig, DispatchConfig
from motor_gateway.client import GrpcDispatchClient
from motor_gateway.pool import CoordinatorPool
from tests.coordinator.grpc_util import KEY, MD, pbs
from tests.coordinator.test_dispatch_sim import MODEL, instance
from tests.coordinator.test_kv_load_retry_sim import set_fault
from tests.helpers import wait_for
from tests.procs import Proc, start_simulator

pytestmark = pytest.mark.slow
HOSTS = ("127.0.0.1", "localhost")
BODY = {"model": MODEL, "prompt": "rotate", "max_tokens": 3}
HELD = "held-model"


class Rig:
    def __init__(self, tmp: Path, client: GrpcDispatchClient, pool: CoordinatorPool, sim: Proc, slow: Proc,
                 ca: certs.Ca, cert: Path, key: Path) -> None:
        self.tmp, self.client, self.pool, self.ca, self.cert, self.key = tmp, client, pool, ca, cert, key
        self.sim, self.slow = sim, slow  # serving MODEL, and HELD (the request kept open)

    def rotate(self, name: str) -> None:
        fresh = certs.issue(self.ca, self.tmp / "issued", name, HOSTS)
        for src, dst in ((fresh.cert_file, self.cert), (fresh.key_file, self.key)):
            shutil.copy(src, dst.with_suffix(".tmp"))
            os.replace(dst.with_suffix(".tmp"), dst)

    async def complete(self, rid: str) -> bytes:
        stream = await self.client.dispatch(rid, "completions", orjson.dumps(BODY), BODY)
        assert stream.head.status == 200
        return b"".join([c async for c in stream.chunks()])

    async def hold(self, rid: str) -> DispatchStream:
        """A streamed request on the slowed engine: its head arrives, its tokens take minutes."""
        body = dict(BODY, model=HELD, stream=True, max_tokens=50)
        return await self.client.dispatch(rid, "completions", orjson.dumps(body), body)


@asynccontextmanager
async def rig(tmp: Path) -> AsyncIterator[Rig]:
    ca = certs.make_ca(tmp / "ca")
    server = certs.issue(ca, tmp / "ca", "coordinator", HOSTS)
    first = certs.issue(ca, tmp / "issued", "gateway-1", HOSTS)
    cert, key = tmp / "gateway.pem", tmp / "gateway.key"
    shutil.copy(first.cert_file, cert)
    shutil.copy(first.key_file, key)
    client_tls = TlsConfig(cert_file=str(cert), key_file=str(key), ca_file=str(ca.cert_file))
    async with AsyncExitStack() as st:
        sim = await st.enter_async_context(start_simulator("vllm", "union", tmp))
        slow = await st.enter_async_context(start_simulator("vllm", "union", tmp, model=HELD, name="held"))
        set_fault(slow, mode="slow", factor=1000, token_delay_ms=5000)
        app = Coordinator(CoordinatorConfig(
            server=ServerConfig(port=0, tls=TlsConfig(cert_file=str(server.cert_file), key_file=str(server.key_file),
                                                      ca_file=str(ca.cert_file), require_client_cert=True)),
            dispatch=DispatchConfig(health_probe_interval_sec=0, metrics_scrape_interval_sec=0, connect_timeout_sec=1.0),
        ), management_key=KEY)
        port = await app.start()
        st.push_async_callback(app.stop, 0)
        addr = f"127.0.0.1:{port}"
        async with open_channel(addr, tls=client_tls) as ch:
            await cgrpc.InstanceRegistryServiceStub(ch).SetInstances(
                cpb.SetInstancesRequest(instances=pbs(
                    instance(1, Role.UNION, EngineType.VLLM, [sim]),
                    replace(instance(2, Role.UNION, EngineType.VLLM, [slow]), model_name=HELD))),
                metadata=MD, timeout=10)
        pool = CoordinatorPool([addr], tls=client_tls)
        st.push_async_callback(pool.close)
        yield Rig(tmp, GrpcDispatchClient(pool, request_timeout=60, control_timeout=10), pool, sim, slow, ca, cert, key)


async def test_after_a_rotation_requests_go_on_a_new_stream_and_the_old_one_drains(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        member = r.pool._members[r.pool.current]
        channel, mux = member.channel, member.mux
        assert isinstance(channel, ReloadingChannel)
        assert b'"choices"' in await r.complete("before")
        assert mux.opened == 1

        held = await r.hold("held")  # open on the first stream
        first_stream = mux._stream
        assert first_stream is not None and len(first_stream.calls) == 1

        r.rotate("gateway-2")
        assert b'"choices"' in await r.complete("after")  # on a new stream, new connection
        assert mux.opened == 2 and channel.reloads == 1
        assert first_stream.retired and len(first_stream.calls) == 1 and channel.draining == 1
        assert b'"choices"' in await r.complete("after-2")  # the new stream again
        assert mux.opened == 2

        await held.aclose()  # the client goes away: the held request ends, the old stream is idle
        await wait_for(lambda: channel.draining == 0, timeout=15,
                       what="the retired stream half-closed and the old connection closed")
        assert b'"choices"' in await r.complete("later")
        assert mux.opened == 2


async def test_a_request_still_open_on_a_retired_stream_at_the_drain_time_fails_and_does_not_hang(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path) as r:
        member = r.pool._members[r.pool.current]
        channel, mux = member.channel, member.mux
        assert isinstance(channel, ReloadingChannel)
        channel.drain_sec = 1.0
        assert b'"choices"' in await r.complete("before")
        held = await r.hold("held")
        r.rotate("gateway-2")
        assert b'"choices"' in await r.complete("after")
        assert mux.opened == 2
        with pytest.raises(DispatchFailed) as cut:
            async with asyncio.timeout(20):
                async for _ in held.chunks():
                    pass
        assert cut.value.error.status == 503
        await wait_for(lambda: channel.draining == 0, timeout=15, what="the old connection closed")
        assert b'"choices"' in await r.complete("later")
