"""Thin gRPC servicers: proto ↔ domain at the boundary, everything else in ``Controller``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from motor_common.convert import node_spec_from_pb
from motor_common.errors import InvalidArgument
from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as pbgrpc
from motor_controller.controller import Controller
from motor_controller.convert import (
    alarm_from_pb,
    alarm_to_pb,
    managed_to_pb,
    node_to_pb,
    observation_from_pb,
)
from motor_controller.fault_policy import AWAIT_RECOVERY, DP_SCALE_DOWN, NODE_RESTART, FtState
from motor_controller.model import FaultReport
from motor_controller.operator_pause import check_reason, target

CONTROLLER_SERVICE = "motor.controller.v1.ControllerService"
ADMIN_SERVICE = "motor.controller.v1.ControllerAdminService"

T = TypeVar("T")
MAX_PAGE = 1000
# Alarms per ListAlarms page: an alarm's source and address are at most 512 characters and its
# message 1,024 (convert.py), so a page stays far below a client's default 4 MiB message limit.
MAX_ALARM_PAGE = 200

_LEVELS = {pb.FAULT_LEVEL_ENGINE_UNHEALTHY: "engine_unhealthy", pb.FAULT_LEVEL_ENGINE_DEAD: "engine_dead"}
_FT_STATE = {
    FtState.IDLE: pb.FAULT_TOLERANCE_STATE_IDLE,
    FtState.RUNNING: pb.FAULT_TOLERANCE_STATE_RELAUNCHING,
    FtState.FAILED: pb.FAULT_TOLERANCE_STATE_FAILED,
}
_RUNNING_BY_STRATEGY = {
    AWAIT_RECOVERY: pb.FAULT_TOLERANCE_STATE_AWAITING_RECOVERY,
    NODE_RESTART: pb.FAULT_TOLERANCE_STATE_RESTARTING_NODES,
    DP_SCALE_DOWN: pb.FAULT_TOLERANCE_STATE_RECONFIGURING,
}
_SOURCES = {
    pb.FAULT_SOURCE_PROCESS_EXIT: "process_exit",
    pb.FAULT_SOURCE_HEALTH_PROBE: "health_probe",
    pb.FAULT_SOURCE_ENGINE_PUBLISHER: "engine_publisher",
}


def _page(items: list[T], size: int, token: str) -> tuple[list[T], str]:
    if token and not (token.isascii() and token.isdigit()):
        raise InvalidArgument(f"bad page_token {token[:100]!r}: pass the next_page_token of the previous page",
                              reason="INVALID_PAGE_TOKEN")
    start = int(token) if token else 0
    size = min(size or MAX_PAGE, MAX_PAGE)
    end = start + size
    return items[start:end], (str(end) if end < len(items) else "")


def _always() -> None:
    return None


class ControllerServicer(pbgrpc.ControllerServiceServicer):
    """*gate* raises (UNAVAILABLE ``NOT_MASTER``) on a controller that is not the acting master."""

    def __init__(self, controller: Controller, gate: Callable[[], None] = _always) -> None:
        self.ctl = controller
        self.gate = gate

    async def RegisterNode(self, request: pb.RegisterNodeRequest, context: Any) -> pb.RegisterNodeResponse:
        self.gate()
        if not request.HasField("node"):
            raise InvalidArgument("node is required", reason="INVALID_NODE_SPEC")
        spec = node_spec_from_pb(request.node)
        await self.ctl.register_node(spec)
        return pb.RegisterNodeResponse(
            node_id=spec.node_id,
            heartbeat_interval_seconds=self.ctl.config.heartbeat_interval_sec,
            controller_epoch=self.ctl.epoch,
        )

    async def Heartbeat(
        self, request_iterator: AsyncIterator[pb.HeartbeatRequest], context: Any
    ) -> AsyncIterator[pb.HeartbeatResponse]:
        clock, wall = self.ctl._clock, self.ctl._wall
        self.gate()
        async for frame in request_iterator:
            self.gate()  # demoted mid-stream: end it, the nodemanager reconnects (to the master)
            known = self.ctl.heartbeat(frame.node_id, observation_from_pb(frame, clock(), wall()))
            if known:
                yield pb.HeartbeatResponse(acked_sequence=frame.sequence, command=pb.HEARTBEAT_COMMAND_NONE)
            else:
                yield pb.HeartbeatResponse(
                    acked_sequence=frame.sequence,
                    command=pb.HEARTBEAT_COMMAND_REREGISTER,
                    message=f"node {frame.node_id!r} is not registered with this controller",
                )

    async def ReportFault(self, request: pb.ReportFaultRequest, context: Any) -> pb.ReportFaultResponse:
        self.gate()
        if not request.node_id:
            raise InvalidArgument("node_id is required", reason="INVALID_FAULT")
        if request.level not in _LEVELS:
            raise InvalidArgument("level must be ENGINE_UNHEALTHY or ENGINE_DEAD", reason="INVALID_FAULT")
        report = FaultReport(
            node_id=request.node_id,
            instance_id=request.instance_id,
            endpoint_id=request.endpoint_id,
            level=_LEVELS[request.level],
            source=_SOURCES.get(request.source, "unspecified"),
            pid=request.pid,
            detail=request.detail,
            received_at=self.ctl._wall(),
        )
        accepted, relaunch = await self.ctl.report_fault(report)
        return pb.ReportFaultResponse(accepted=accepted, relaunch_expected=relaunch)

    async def ReportAlarm(self, request: pb.ReportAlarmRequest, context: Any) -> pb.ReportAlarmResponse:
        self.gate()
        if not request.HasField("alarm"):
            raise InvalidArgument("alarm is required", reason="INVALID_ALARM")
        accepted = await self.ctl.report_alarm(alarm_from_pb(request.alarm, self.ctl._wall()))
        return pb.ReportAlarmResponse(accepted=accepted)


class ControllerAdminServicer(pbgrpc.ControllerAdminServiceServicer):
    """Reads are answered by any controller; mutations pass *gate* first."""

    def __init__(self, controller: Controller, gate: Callable[[], None] = _always) -> None:
        self.ctl = controller
        self.gate = gate

    async def ListNodes(self, request: pb.ListNodesRequest, context: Any) -> pb.ListNodesResponse:
        recs = sorted(
            (r for r in self.ctl.nodes.values() if not request.job_name or r.spec.job_name == request.job_name),
            key=lambda r: (r.spec.job_name, r.spec.node_rank, r.spec.node_id),
        )
        page, token = _page(recs, request.page_size, request.page_token)
        return pb.ListNodesResponse(
            nodes=[node_to_pb(r, self.ctl.observations.get(r.spec.node_id)) for r in page], next_page_token=token
        )

    async def ListInstances(self, request: pb.ListInstancesRequest, context: Any) -> pb.ListInstancesResponse:
        items = sorted(
            (m for m in self.ctl.instances.values() if not request.job_name or m.job_name == request.job_name),
            key=lambda m: (m.job_name, m.incarnation, m.id),
        )
        page, token = _page(items, request.page_size, request.page_token)
        return pb.ListInstancesResponse(instances=[managed_to_pb(m) for m in page], next_page_token=token)

    async def GetInstance(self, request: pb.GetInstanceRequest, context: Any) -> pb.GetInstanceResponse:
        return pb.GetInstanceResponse(instance=managed_to_pb(self.ctl.get_instance(request.instance_id)))

    async def TerminateInstance(
        self, request: pb.TerminateInstanceRequest, context: Any
    ) -> pb.TerminateInstanceResponse:
        self.gate()
        stopped = await self.ctl.terminate_instance(
            request.instance_id, request.precision_alarm_clear, request.reason
        )
        return pb.TerminateInstanceResponse(stopped_node_ids=stopped)

    async def GetFaultToleranceStatus(
        self, request: pb.GetFaultToleranceStatusRequest, context: Any
    ) -> pb.GetFaultToleranceStatusResponse:
        if request.instance_id:
            self.ctl.get_instance(request.instance_id)
        if not self.ctl.config.fault_tolerance_config.enable_fault_tolerance:
            return pb.GetFaultToleranceStatusResponse(state=pb.FAULT_TOLERANCE_STATE_DISABLED)
        progress = self.ctl.fault_manager.progress.get(request.instance_id)
        if progress is None:
            return pb.GetFaultToleranceStatusResponse(state=pb.FAULT_TOLERANCE_STATE_IDLE,
                                                      retired_dp_ranks=self.ctl.retired_dp_ranks(request.instance_id))
        state = _FT_STATE[progress.state]
        if progress.state is FtState.RUNNING:
            state = _RUNNING_BY_STRATEGY.get(progress.strategy, state)
        return pb.GetFaultToleranceStatusResponse(
            state=state,
            strategy=progress.strategy,
            phase=progress.phase,
            relaunch_attempts=progress.relaunch_attempts,
            last_error=progress.last_error,
            retired_dp_ranks=self.ctl.retired_dp_ranks(request.instance_id),
        )

    async def PauseInstance(self, request: pb.PauseInstanceRequest, context: Any) -> pb.PauseInstanceResponse:
        self.gate()
        iid = target(request.instance_id, request.node_id, self.ctl.instances.values())
        mi = await self.ctl.set_paused(iid, True, check_reason(request.reason))
        return pb.PauseInstanceResponse(instance=managed_to_pb(mi))

    async def ResumeInstance(self, request: pb.ResumeInstanceRequest, context: Any) -> pb.ResumeInstanceResponse:
        self.gate()
        mi = await self.ctl.set_paused(target(request.instance_id, request.node_id, self.ctl.instances.values()), False)
        return pb.ResumeInstanceResponse(instance=managed_to_pb(mi),
                                         paused_node_ids=self.ctl.nodes_paused_by_nodemanager(mi.id))

    async def ListAlarms(self, request: pb.ListAlarmsRequest, context: Any) -> pb.ListAlarmsResponse:
        page, token = _page(self.ctl.alarms.entries(request.active_only), min(request.page_size or MAX_ALARM_PAGE,
                                                                              MAX_ALARM_PAGE), request.page_token)
        return pb.ListAlarmsResponse(alarms=[alarm_to_pb(a) for a in page], next_page_token=token)
