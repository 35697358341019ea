"""CoordinatorPusher over the real gRPC client, against a real gRPC server on a loopback port.

The server is a stand-in coordinator whose SetInstances can be held open, so a promotion's
reconnect lands while a SET is in flight — what happened in `motor up --ha` when the master was
promoted during the controller's first push: grpc.aio raised CancelledError in the pusher (not an
RPC error), its task ended silently and that coordinator never received an instance set.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from motor_common.convert import instance_from_pb
from motor_common.domain import Endpoint, EngineType, Instance, Role
from motor_common.errors import Unavailable
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.tasks import TaskOwner
from motor_controller.peers import GrpcCoordinator
from motor_controller.push_plan import Op, OpKind
from motor_controller.pusher import CoordinatorPusher
from motor_controller.store import MemoryStore
from tests.helpers import wait_for


def inst(iid: int) -> Instance:
    return Instance(
        iid, Role.DECODE, f"j{iid}", "m", EngineType.VLLM, (Endpoint(0, "127.0.0.1", 9000 + iid),)
    )


class HeldCoordinator(cgrpc.InstanceRegistryServiceServicer):
    """Applies SETs; the first one waits until :attr:`release` is set."""

    def __init__(self) -> None:
        self.generation = 0
        self.instances: dict[int, Instance] = {}
        self.sets_started = 0
        self.release = asyncio.Event()

    async def SetInstances(
        self, request: cpb.SetInstancesRequest, context: grpc.aio.ServicerContext
    ) -> cpb.SetInstancesResponse:
        self.sets_started += 1
        if self.sets_started == 1:
            await self.release.wait()
        self.generation = request.generation
        self.instances = {i.id: i for i in map(instance_from_pb, request.instances)}
        return cpb.SetInstancesResponse(generation=self.generation)

    async def ListInstances(
        self, request: cpb.ListInstancesRequest, context: grpc.aio.ServicerContext
    ) -> cpb.ListInstancesResponse:
        return cpb.ListInstancesResponse(generation=self.generation)


@pytest.fixture
async def coordinator() -> AsyncIterator[tuple[HeldCoordinator, str]]:
    servicer = HeldCoordinator()
    server = grpc.aio.server()
    cgrpc.add_InstanceRegistryServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        servicer.release.set()
        await server.stop(0)


async def test_a_call_cut_short_by_reconnect_is_an_unavailable_error_not_a_cancellation(
    coordinator: tuple[HeldCoordinator, str],
) -> None:
    servicer, address = coordinator
    client = GrpcCoordinator(address, None, timeout=10)
    try:
        call = asyncio.create_task(client.apply(Op(OpKind.SET, (inst(1),), 1)))
        await wait_for(lambda: servicer.sets_started == 1, timeout=5, what="the SET in flight")
        client.reconnect()
        with pytest.raises(Unavailable) as err:
            await call
        assert err.value.reason == "CONNECTION_REOPENED" and not call.cancelled()
        assert client.epoch == 1
        # The new channel works.
        assert await client.apply(Op(OpKind.SET, (inst(2),), 2)) == 2
        assert set(servicer.instances) == {2}
    finally:
        await client.close()


async def test_the_pusher_survives_a_promotion_during_its_first_set_and_delivers_the_view(
    coordinator: tuple[HeldCoordinator, str],
) -> None:
    servicer, address = coordinator
    client = GrpcCoordinator(address, None, timeout=10)
    desired = {1: inst(1), 2: inst(2)}
    pusher = CoordinatorPusher(
        client, lambda: desired, MemoryStore(), sync_interval=30, set_retry_interval=1
    )
    owner = TaskOwner("test")
    task = owner.spawn(pusher.run(), name="pusher")
    try:
        await wait_for(
            lambda: servicer.sets_started == 1, timeout=5, what="the first SET in flight"
        )
        pusher.request_full_set(reconnect=True)  # the coordinator announced its promotion
        await wait_for(
            lambda: set(servicer.instances) == {1, 2},
            timeout=5,
            what="the view delivered after the reconnect",
        )
        assert not task.done()
        assert pusher.state.synced is not None and set(pusher.state.synced) == {1, 2}
        # Later changes still flow: the loop is alive.
        desired[3] = inst(3)
        pusher.poke()
        await wait_for(
            lambda: set(servicer.instances) == {1, 2, 3}, timeout=5, what="a later change pushed"
        )
    finally:
        await owner.close()
        await client.close()
