"""gRPC helpers for coordinator tests."""

from __future__ import annotations

from motor_common.convert import instance_to_pb
from motor_common.domain import Instance
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_client import call_metadata, open_channel

KEY = "test-key"
MD = call_metadata(KEY)


def pbs(*instances: Instance) -> list[object]:
    return [instance_to_pb(i) for i in instances]


class Stubs:
    def __init__(self, address: str) -> None:
        self.channel = open_channel(address)
        self.registry = cgrpc.InstanceRegistryServiceStub(self.channel)
        self.dispatch = cgrpc.DispatchServiceStub(self.channel)

    async def set(self, *instances: Instance, generation: int = 0) -> cpb.SetInstancesResponse:
        return await self.registry.SetInstances(
            cpb.SetInstancesRequest(instances=pbs(*instances), generation=generation), metadata=MD, timeout=5
        )

    async def add(self, *instances: Instance, generation: int = 0) -> cpb.AddInstancesResponse:
        return await self.registry.AddInstances(
            cpb.AddInstancesRequest(instances=pbs(*instances), generation=generation), metadata=MD, timeout=5
        )

    async def delete(self, *instances: Instance, generation: int = 0) -> cpb.DeleteInstancesResponse:
        return await self.registry.DeleteInstances(
            cpb.DeleteInstancesRequest(instances=pbs(*instances), generation=generation), metadata=MD, timeout=5
        )

    async def list(self, **kw: object) -> cpb.ListInstancesResponse:
        return await self.registry.ListInstances(cpb.ListInstancesRequest(**kw), metadata=MD, timeout=5)

    async def ids(self) -> set[int]:
        return {i.id for i in (await self.list()).instances}

    async def readiness(self) -> cpb.GetReadinessResponse:
        return await self.dispatch.GetReadiness(cpb.GetReadinessRequest(), timeout=5)

    async def close(self) -> None:
        await self.channel.close()
