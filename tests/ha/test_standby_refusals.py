"""A standby coordinator's refusal names the master it knows (ErrorInfo metadata ``master``; the
message stays "Coordinator is not master", since a gateway passes messages on to HTTP clients):
real etcd, two coordinators (in process, real gRPC servers), Dispatch and DispatchMany sent to the
standby over gRPC. Before, nothing in the refusal told a caller (an operator with grpcurl, a
gateway's log) where the master is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import grpc
import pytest

from motor_common.domain import Role
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_server import ServerConfig, error_info
from motor_common.leadership import LeaderRole
from motor_coordinator.app import Coordinator
from motor_coordinator.config import CoordinatorConfig, DispatchConfig, HaConfig
from tests.coordinator.factories import inst
from tests.coordinator.grpc_util import KEY, Stubs
from tests.etcd_server import etcd_server
from tests.helpers import wait_for

pytestmark = [pytest.mark.etcd, pytest.mark.slow, pytest.mark.timeout(60)]

ELECTION_KEY = "/motor/standby-refusals/leader"
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


@asynccontextmanager
async def coordinator(etcd: str) -> AsyncIterator[tuple[Coordinator, Stubs]]:
    cfg = CoordinatorConfig(
        server=ServerConfig(port=0), master_lock_ttl=2, master_standby_check_interval=0.1,
        dispatch=DispatchConfig(health_probe_interval_sec=0, metrics_scrape_interval_sec=0),
        ha=HaConfig(etcd_endpoints=(etcd,), election_key=ELECTION_KEY, unsynced_campaign_delay_sec=0))
    app = Coordinator(cfg, management_key=KEY)
    port = await app.start()
    stubs = Stubs(f"127.0.0.1:{port}")
    try:
        yield app, stubs
    finally:
        await stubs.close()
        await app.stop(0)


async def test_a_standby_refuses_dispatch_not_master_naming_the_master() -> None:
    async with etcd_server() as etcd, AsyncExitStack() as st:
        a, a_stubs = await st.enter_async_context(coordinator(etcd.endpoint))
        await a_stubs.set(inst(1, Role.UNION))
        await wait_for(lambda: a.leadership.role is LeaderRole.MASTER, timeout=10, what="a master")
        b, b_stubs = await st.enter_async_context(coordinator(etcd.endpoint))
        await b_stubs.set(inst(1, Role.UNION))
        await wait_for(lambda: b.leadership.holder == a.address, timeout=10, what="b seeing a as master")
        assert b.leadership.role is LeaderRole.STANDBY

        channel = grpc.aio.insecure_channel(b.address)
        st.push_async_callback(channel.close)
        stub = cgrpc.DispatchServiceStub(channel)
        request = cpb.DispatchRequest(api=cpb.OPEN_AI_API_CHAT_COMPLETIONS, body=BODY, request_id="r1")

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Dispatch(request, timeout=5).read()
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        info = error_info(refused.value)
        assert info is not None and info.reason == "NOT_MASTER"
        assert info.metadata["master"] == a.address
        assert refused.value.details() == "Coordinator is not master"  # no address in what HTTP clients may see

        many = stub.DispatchMany(timeout=5)
        await many.write(cpb.DispatchManyRequest(commands=[cpb.DispatchCommand(
            stream_id=1, start=cpb.DispatchStart(request=request, timeout_ms=5000))]))
        reply = await many.read()
        (event,) = reply.events
        assert event.WhichOneof("kind") == "error"
        assert event.error.code == grpc.StatusCode.UNAVAILABLE.value[0]
        assert event.error.reason == "NOT_MASTER"
        assert event.error.metadata["master"] == a.address
        assert event.error.message == "Coordinator is not master"
        await many.done_writing()
