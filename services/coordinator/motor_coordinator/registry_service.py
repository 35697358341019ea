"""``motor.coordinator.v1.InstanceRegistryService``: proto ↔ domain, then the pure registry."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from motor_common.convert import ROLE_FROM_PB, instance_from_pb, instance_to_pb
from motor_common.domain import Instance, InstanceStatus, Role
from motor_common.errors import InvalidArgument
from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_coordinator import registry

if TYPE_CHECKING:
    from motor_coordinator.app import Coordinator

SERVICE_NAME = "motor.coordinator.v1.InstanceRegistryService"


def _instances(msgs: Sequence[tpb.Instance]) -> list[Instance]:
    return [instance_from_pb(m, f"instances[{i}]") for i, m in enumerate(msgs)]


def _check_if_generation(
    current: int, request: cpb.SetInstancesRequest | cpb.AddInstancesRequest | cpb.DeleteInstancesRequest
) -> None:
    cond = request.if_generation if request.HasField("if_generation") else None
    registry.check_if_generation(current, cond, request.generation)


class RegistryServicer(cgrpc.InstanceRegistryServiceServicer):
    def __init__(self, app: Coordinator) -> None:
        self.app = app

    async def SetInstances(self, request: cpb.SetInstancesRequest, context: Any) -> cpb.SetInstancesResponse:
        _check_if_generation(self.app.state.generation, request)
        new = registry.set_instances(self.app.state, _instances(request.instances), request.generation)
        self.app.commit(new)
        return cpb.SetInstancesResponse(generation=new.generation, instance_count=len(new.instances))

    async def AddInstances(self, request: cpb.AddInstancesRequest, context: Any) -> cpb.AddInstancesResponse:
        _check_if_generation(self.app.state.generation, request)
        new, added = registry.add_instances(self.app.state, _instances(request.instances), request.generation)
        self.app.commit(new)
        return cpb.AddInstancesResponse(generation=new.generation, added_ids=added)

    async def DeleteInstances(
        self, request: cpb.DeleteInstancesRequest, context: Any
    ) -> cpb.DeleteInstancesResponse:
        _check_if_generation(self.app.state.generation, request)
        new, deleted = registry.delete_instances(self.app.state, _instances(request.instances), request.generation)
        self.app.commit(new)
        return cpb.DeleteInstancesResponse(generation=new.generation, deleted_ids=deleted)

    async def PauseInstances(self, request: cpb.PauseInstancesRequest, context: Any) -> cpb.PauseInstancesResponse:
        new = registry.pause_instances(self.app.state, request.instance_ids, request.generation)
        self.app.commit(new)
        return cpb.PauseInstancesResponse(generation=new.generation)

    async def ResumeInstances(
        self, request: cpb.ResumeInstancesRequest, context: Any
    ) -> cpb.ResumeInstancesResponse:
        new = registry.resume_instances(self.app.state, request.instance_ids, request.generation)
        self.app.commit(new)
        return cpb.ResumeInstancesResponse(generation=new.generation)

    async def ListInstances(self, request: cpb.ListInstancesRequest, context: Any) -> cpb.ListInstancesResponse:
        role: Role | None = None
        if request.role != tpb.ROLE_UNSPECIFIED:
            if request.role not in ROLE_FROM_PB:
                raise InvalidArgument(f"unknown role {request.role}", reason="INVALID_ROLE")
            role = ROLE_FROM_PB[request.role]
        shown = self.app.observed_instances()
        page, token = registry.list_page(shown, role, request.page_size, request.page_token)
        summary = cpb.InstanceSummary(
            available=sum(i.status is InstanceStatus.AVAILABLE for i in shown),
            unavailable=sum(i.status is InstanceStatus.UNAVAILABLE for i in shown),
            paused=sum(i.status is InstanceStatus.PAUSED for i in shown),
            prefill=sum(i.role is Role.PREFILL for i in shown),
            decode=sum(i.role is Role.DECODE for i in shown),
            union_instances=sum(i.role is Role.UNION for i in shown),
        )
        return cpb.ListInstancesResponse(
            instances=[instance_to_pb(i) for i in page],
            summary=summary,
            generation=self.app.state.generation,
            next_page_token=token,
        )

    async def GetInstance(self, request: cpb.GetInstanceRequest, context: Any) -> cpb.GetInstanceResponse:
        inst = self.app.state.get(request.instance_id)
        return cpb.GetInstanceResponse(instance=instance_to_pb(self.app.observed(inst)))

    async def ClearPrecisionAlarms(
        self, request: cpb.ClearPrecisionAlarmsRequest, context: Any
    ) -> cpb.ClearPrecisionAlarmsResponse:
        return cpb.ClearPrecisionAlarmsResponse(cleared=self.app.clear_precision_alarms(request.instance_ids))


def observed(inst: Instance, unavailable: bool) -> Instance:
    """The registered instance with UNAVAILABLE when all its endpoints are out of rotation."""
    if inst.status is InstanceStatus.AVAILABLE and unavailable:
        return replace(inst, status=InstanceStatus.UNAVAILABLE)
    return inst
