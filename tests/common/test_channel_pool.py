"""The per-address channel pool: channels close once idle, never while a call is in flight."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from motor_common.channel_pool import ChannelPool, Use, idle_addresses
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as npb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2_grpc as ngrpc
from motor_common.grpc_server import GrpcServer, ServerConfig
from motor_controller.peers import GrpcNodeManagers
from motor_controller.scale_down_client import GrpcScaleDown


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_idle_addresses_needs_no_call_in_flight_and_the_idle_time() -> None:
    uses = {"a:1": Use(0, 0.0), "b:1": Use(1, 0.0), "c:1": Use(0, 250.0), "d:1": Use(0, 200.0)}
    assert idle_addresses(uses, 500.0, 300.0) == ["a:1", "d:1"]
    assert idle_addresses(uses, 100.0, 300.0) == []


def test_idle_close_sec_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ChannelPool(idle_close_sec=0)


class StopRecorder(ngrpc.NodeManagerServiceServicer):
    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.release = asyncio.Event()
        self.slow_started = asyncio.Event()

    async def StopNode(self, request: npb.StopNodeRequest, context: object) -> npb.StopNodeResponse:
        self.reasons.append(request.reason)
        if request.reason == "slow":
            self.slow_started.set()
            await self.release.wait()
        return npb.StopNodeResponse()


@pytest.fixture
async def servers() -> AsyncIterator[tuple[list[str], StopRecorder]]:
    impl = StopRecorder()
    started = []
    for _ in range(2):
        server = GrpcServer("test", ServerConfig())
        server.add_service(
            "motor.nodemanager.v1.NodeManagerService",
            lambda s: ngrpc.add_NodeManagerServiceServicer_to_server(impl, s),
        )
        started.append((server, await server.start()))
    yield [f"127.0.0.1:{port}" for _, port in started], impl
    impl.release.set()
    for server, _ in started:
        await server.stop(0)


async def _healthy(ch: grpc.aio.Channel) -> bool:
    resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


async def test_an_idle_channel_is_closed_at_the_next_use_and_reopened_when_needed(
    servers: tuple[list[str], StopRecorder],
) -> None:
    (a, b), _ = servers
    clock = Clock()
    pool = ChannelPool(idle_close_sec=60, clock=clock)
    async with pool.channel(a) as ch_a:
        assert await _healthy(ch_a)
    clock.now += 59
    async with pool.channel(b) as ch_b:
        assert await _healthy(ch_b)
    assert pool.addresses() == sorted([a, b])  # a: 59 s idle, kept
    clock.now += 30
    async with pool.channel(b) as ch_b2:
        assert ch_b2 is ch_b and await _healthy(ch_b2)
    assert pool.addresses() == [b]  # a: 89 s idle, closed
    with pytest.raises(grpc.aio.UsageError):  # really closed, not only forgotten
        await _healthy(ch_a)
    async with pool.channel(a) as ch_a2:  # a comes back: a new channel
        assert ch_a2 is not ch_a and await _healthy(ch_a2)
    await pool.close()
    assert pool.addresses() == []


async def test_a_channel_with_a_call_in_flight_is_not_closed(servers: tuple[list[str], StopRecorder]) -> None:
    (a, b), impl = servers
    clock = Clock()
    pool = ChannelPool(idle_close_sec=60, clock=clock)
    nms = GrpcNodeManagers(None, 10, pool=pool)
    slow = asyncio.create_task(nms.stop_node(a, "slow"))
    await asyncio.wait_for(impl.slow_started.wait(), 10)
    clock.now += 3600
    await nms.stop_node(b, "fast")  # sweeps: a has a call in flight
    assert pool.addresses() == sorted([a, b])
    impl.release.set()
    await asyncio.wait_for(slow, 10)  # the slow StopNode finished on its channel
    clock.now += 3600
    await GrpcScaleDown(None, pool=pool).close()  # the scale-down client shares (and closes) the pool
    assert pool.addresses() == []
    await nms.stop_node(b, "again")  # a closed pool opens channels again
    assert impl.reasons == ["slow", "fast", "again"] and pool.addresses() == [b]
    await nms.close()


async def test_the_controller_clients_close_idle_nodemanager_channels(
    servers: tuple[list[str], StopRecorder],
) -> None:
    (a, b), impl = servers
    clock = Clock()
    nms = GrpcNodeManagers(None, 10, pool=ChannelPool(idle_close_sec=60, clock=clock))
    await nms.stop_node(a, "one")
    clock.now += 120  # a's node moved to b (a rescheduled pod)
    await nms.stop_node(b, "two")
    assert nms._pool.addresses() == [b]
    assert impl.reasons == ["one", "two"]
    await nms.close()
