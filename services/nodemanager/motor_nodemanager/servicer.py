"""gRPC servicers: protobuf ↔ domain at the boundary, everything else in :class:`Node`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from motor_common.convert import (
    endpoint_from_pb,
    endpoint_health_to_pb,
    engine_from_pb,
    role_from_pb,
)
from motor_common.errors import InvalidArgument, MotorError
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as pb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2_grpc as pbg
from motor_common.grpc_server import GrpcServer
from motor_nodemanager import scale_down as sd
from motor_nodemanager.config import NodeManagerConfig
from motor_nodemanager.controller_client import timestamp
from motor_nodemanager.node import Node
from motor_nodemanager.scale_down_proxy import ScaleDownProxy
from motor_nodemanager.start_command import StartCommand

log = logging.getLogger(__name__)

NODEMANAGER_SERVICE = "motor.nodemanager.v1.NodeManagerService"
SCALE_DOWN_SERVICE = "motor.nodemanager.v1.ScaleDownService"


def start_command_from_pb(req: pb.StartEnginesRequest) -> StartCommand:
    """Convert (enums must be set: INVALID_ARGUMENT otherwise)."""
    try:
        role = role_from_pb(req.role)
        engine = engine_from_pb(req.engine_type)
    except InvalidArgument as exc:
        raise InvalidArgument(f"Invalid start command payload: {exc.message}", reason=exc.reason) from exc
    return StartCommand(
        instance_id=req.instance_id,
        job_name=req.job_name,
        role=role,
        engine_type=engine,
        model_name=req.model_name,
        endpoints=tuple(endpoint_from_pb(e) for e in req.endpoints),
        node_rank=req.node_rank,
        num_nodes=req.num_nodes or 1,
        master_address=req.master_address,
        master_port=req.master_port,
        dp_size=req.dp_size or len(req.endpoints),
        generation=req.generation,
        peers=tuple(endpoint_from_pb(e) for e in req.peers),
    )


class NodeManagerServicer(pbg.NodeManagerServiceServicer):
    def __init__(self, node: Node, stop_node: Callable[[str], Awaitable[None]]) -> None:
        self._node = node
        self._stop_node = stop_node

    async def StartEngines(self, request: pb.StartEnginesRequest, context: Any) -> pb.StartEnginesResponse:
        cmd = start_command_from_pb(request)
        pids = await self._node.start_engines(cmd)
        return pb.StartEnginesResponse(pids=pids)

    async def StopNode(self, request: pb.StopNodeRequest, context: Any) -> pb.StopNodeResponse:
        log.warning("StopNode: %s", request.reason or "(no reason given)")
        await self._stop_node(request.reason or "StopNode")  # engines stopped before the answer
        return pb.StopNodeResponse()

    async def PauseNode(self, request: pb.PauseNodeRequest, context: Any) -> pb.PauseNodeResponse:
        self._node.pause()
        return pb.PauseNodeResponse()

    async def ResumeNode(self, request: pb.ResumeNodeRequest, context: Any) -> pb.ResumeNodeResponse:
        self._node.resume()
        return pb.ResumeNodeResponse()

    async def GetStatus(self, request: pb.GetStatusRequest, context: Any) -> pb.GetStatusResponse:
        st = self._node.status()
        resp = pb.GetStatusResponse(
            node_id=st.node_id,
            state=st.state.value,
            instance_id=st.instance_id,
            endpoints=[endpoint_health_to_pb(e) for e in st.endpoints],
            frozen=st.frozen,
            relaunch_count=st.relaunch_count,
            registered=st.registered,
        )
        if st.freeze_deadline is not None:
            resp.freeze_deadline.CopyFrom(timestamp(st.freeze_deadline))
        return resp

    async def GetReadiness(self, request: pb.GetReadinessRequest, context: Any) -> pb.GetReadinessResponse:
        ready, reason = self._node.readiness()
        return pb.GetReadinessResponse(ready=ready, reason=reason)

    async def RestartEngine(self, request: pb.RestartEngineRequest, context: Any) -> pb.RestartEngineResponse:
        if request.action not in (pb.RESTART_ACTION_RESTART, pb.RESTART_ACTION_ABORT):
            raise InvalidArgument("action must be RESTART_ACTION_RESTART or RESTART_ACTION_ABORT", reason="INVALID_ACTION")
        abort = request.action == pb.RESTART_ACTION_ABORT
        # The relaunch outlives the call: a controller that dies or gives up mid-relaunch cancels
        # this handler, and a cancelled relaunch would leave the node with no engine, frozen.
        task = self._node.spawn(self._relaunch(abort, request.instance_id), name="engine-relaunch")
        outcome = await asyncio.shield(task)
        if isinstance(outcome, MotorError):
            raise outcome
        return pb.RestartEngineResponse(relaunch_count=self._node.relaunch_count, pids=outcome)

    async def _relaunch(self, abort: bool, instance_id: int) -> list[int] | MotorError:
        """The relaunch's pids, or the error the caller gets (not a crash of the background task)."""
        try:
            return await self._node.restart_engine(abort=abort, instance_id=instance_id)
        except MotorError as exc:
            return exc


_REPORTED = {
    sd.Reported.DISABLED: pb.SCALE_DOWN_STATE_DISABLED,
    sd.Reported.IDLE: pb.SCALE_DOWN_STATE_IDLE,
    sd.Reported.GUARDED: pb.SCALE_DOWN_STATE_GUARDED,
    sd.Reported.APPLYING: pb.SCALE_DOWN_STATE_APPLYING,
    sd.Reported.HEALTHY: pb.SCALE_DOWN_STATE_HEALTHY,
    sd.Reported.UNHEALTHY: pb.SCALE_DOWN_STATE_UNHEALTHY,
}


class ScaleDownServicer(pbg.ScaleDownServiceServicer):
    """DP scale-down transaction (guard → apply once → finalize), proxied to the engines; see
    :mod:`motor_nodemanager.scale_down`. Disabled: status DISABLED, every other call FAILED_PRECONDITION."""

    def __init__(self, proxy: ScaleDownProxy) -> None:
        self._sd = proxy

    async def GuardScaleDown(self, request: pb.GuardScaleDownRequest, context: Any) -> pb.GuardScaleDownResponse:
        self._sd.guard(request.request_id, request.instance_id, request.lease_seconds, list(request.dead_dp_ranks))
        return pb.GuardScaleDownResponse(accepted=True)

    async def ApplyScaleDown(self, request: pb.ApplyScaleDownRequest, context: Any) -> pb.ApplyScaleDownResponse:
        await self._sd.apply(request.request_id)
        return pb.ApplyScaleDownResponse(accepted=True)

    async def FinalizeScaleDown(
        self, request: pb.FinalizeScaleDownRequest, context: Any
    ) -> pb.FinalizeScaleDownResponse:
        if request.decision not in (pb.SCALE_DOWN_DECISION_COMMIT, pb.SCALE_DOWN_DECISION_ABORT):
            raise InvalidArgument("decision must be COMMIT or ABORT", reason="INVALID_DECISION")
        retired = self._sd.finalize(request.request_id, request.decision == pb.SCALE_DOWN_DECISION_COMMIT)
        return pb.FinalizeScaleDownResponse(retired_dp_ranks=retired)

    async def GetScaleDownStatus(
        self, request: pb.GetScaleDownStatusRequest, context: Any
    ) -> pb.GetScaleDownStatusResponse:
        state, request_id, retired = await self._sd.status()
        return pb.GetScaleDownStatusResponse(state=_REPORTED[state], request_id=request_id, retired_dp_ranks=retired)


def add_services(
    server: GrpcServer, node: Node, stop_node: Callable[[str], Awaitable[None]], cfg: NodeManagerConfig
) -> None:
    """Register both services (protected by the management key) on *server*."""
    nm = NodeManagerServicer(node, stop_node)
    sdown = ScaleDownServicer(node.scale_down)
    server.add_service(
        NODEMANAGER_SERVICE,
        lambda s: pbg.add_NodeManagerServiceServicer_to_server(nm, s),
        protected=True,
    )
    server.add_service(
        SCALE_DOWN_SERVICE,
        lambda s: pbg.add_ScaleDownServiceServicer_to_server(sdown, s),
        protected=True,
    )
