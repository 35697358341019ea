"""An in-process fake ControllerService on the real gRPC chassis: records what nodemanagers send."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from motor_common.errors import Unavailable
from motor_common.gen.motor.controller.v1 import controller_pb2 as cpb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as cgrpc
from motor_common.grpc_server import GrpcServer, ServerConfig

SERVICE = "motor.controller.v1.ControllerService"


class FakeController(cgrpc.ControllerServiceServicer):
    def __init__(self) -> None:
        self.registrations: list[cpb.NodeSpec] = []
        self.frames: list[cpb.HeartbeatRequest] = []
        self.faults: list[cpb.ReportFaultRequest] = []
        self.fail_registrations = 0
        self.reregister_once = False
        self.fail_faults = 0  # refuse this many ReportFault calls (UNAVAILABLE)
        self.relaunch_expected = False

    async def RegisterNode(self, request: cpb.RegisterNodeRequest, context: Any) -> cpb.RegisterNodeResponse:
        if self.fail_registrations > 0:
            self.fail_registrations -= 1
            raise Unavailable("fake controller refuses registration")
        self.registrations.append(request.node)
        return cpb.RegisterNodeResponse(node_id=request.node.node_id, heartbeat_interval_seconds=1.0, controller_epoch="e1")

    async def Heartbeat(
        self, request_iterator: AsyncIterator[cpb.HeartbeatRequest], context: Any
    ) -> AsyncIterator[cpb.HeartbeatResponse]:
        async for frame in request_iterator:
            self.frames.append(frame)
            cmd = cpb.HEARTBEAT_COMMAND_NONE
            if self.reregister_once:
                self.reregister_once = False
                cmd = cpb.HEARTBEAT_COMMAND_REREGISTER
            yield cpb.HeartbeatResponse(acked_sequence=frame.sequence, command=cmd)

    async def ReportFault(self, request: cpb.ReportFaultRequest, context: Any) -> cpb.ReportFaultResponse:
        if self.fail_faults > 0:
            self.fail_faults -= 1
            raise Unavailable("fake controller refuses fault reports")
        self.faults.append(request)
        return cpb.ReportFaultResponse(accepted=True, relaunch_expected=self.relaunch_expected)

    def last_frame(self) -> cpb.HeartbeatRequest | None:
        return self.frames[-1] if self.frames else None


async def serve_fake_controller(
    port: int = 0, key: str | None = None, impl: FakeController | None = None
) -> tuple[GrpcServer, FakeController]:
    impl = impl or FakeController()
    server = GrpcServer("fake-controller", ServerConfig(port=port, grace_seconds=0.1), management_key=key)
    server.add_service(
        SERVICE,
        lambda s: cgrpc.add_ControllerServiceServicer_to_server(impl, s),
        protected=True,
    )
    await server.start()
    return server, impl
