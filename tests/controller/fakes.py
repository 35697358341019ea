"""Lightweight fake nodemanagers (real gRPC: NodeManagerService server + register/heartbeat client)
and helpers to run an in-process controller."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as pbgrpc
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as npb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2_grpc as ngrpc
from motor_common.grpc_client import call_metadata, open_channel
from motor_common.grpc_server import GrpcServer, ServerConfig

KEY = "controller-test-key"
_ports = itertools.count(20000)


@dataclass
class FakeNodeManager(ngrpc.NodeManagerServiceServicer):
    """A nodemanager that 'launches' engines instantly and heartbeats over the real stream."""

    node_id: str
    job: str
    rank: int
    nodes: int
    controller: str
    eps: int = 2
    role: int = tpb.ROLE_PREFILL
    interval: float = 0.1
    fault_tolerance: bool = False
    starts: list[npb.StartEnginesRequest] = field(default_factory=list)
    stops: list[npb.StopNodeRequest] = field(default_factory=list)
    instance_id: int = 0
    state: int = pb.NODE_STATE_REGISTERED
    endpoint_status: int = tpb.ENDPOINT_STATUS_NORMAL
    heartbeating: bool = True
    registrations: int = 0
    reregister_commands: int = 0
    port: int = 0
    business_ports: list[int] = field(default_factory=list)
    _server: GrpcServer | None = None
    _task: asyncio.Task[Any] | None = None
    _channel: grpc.aio.Channel | None = None

    # -- NodeManagerService -------------------------------------------------------------------
    async def StartEngines(self, request: npb.StartEnginesRequest, context: Any) -> npb.StartEnginesResponse:
        self.starts.append(request)
        self.instance_id = request.instance_id
        self.state = pb.NODE_STATE_RUNNING
        return npb.StartEnginesResponse(pids=[1000 + i for i in range(len(request.endpoints))])

    async def StopNode(self, request: npb.StopNodeRequest, context: Any) -> npb.StopNodeResponse:
        self.stops.append(request)
        self.state = pb.NODE_STATE_STOPPING
        self.heartbeating = False
        return npb.StopNodeResponse()

    # -- client side --------------------------------------------------------------------------
    def spec(self) -> pb.NodeSpec:
        if not self.business_ports:
            self.business_ports = [next(_ports) for _ in range(self.eps)]
        return pb.NodeSpec(
            node_id=self.node_id,
            job_name=self.job,
            role=self.role,
            ip="127.0.0.1",
            admin_port=self.port,
            engine_type=tpb.ENGINE_TYPE_VLLM,
            model_name="m",
            node_rank=self.rank,
            nodes_per_instance=self.nodes,
            endpoints=[tpb.Endpoint(id=i, ip="127.0.0.1", business_port=p, dp_rank=i)
                       for i, p in enumerate(self.business_ports)],
            capabilities=pb.Capabilities(fault_tolerance=self.fault_tolerance),
        )

    async def start(self) -> FakeNodeManager:
        server = GrpcServer(f"fake-nm-{self.node_id}", ServerConfig(port=0), management_key=KEY)
        server.add_service(
            "motor.nodemanager.v1.NodeManagerService",
            lambda s: ngrpc.add_NodeManagerServiceServicer_to_server(self, s),
            protected=True,
        )
        self.port = await server.start()
        self._server = server
        self._channel = open_channel(self.controller)
        await self.register()
        self._task = asyncio.get_running_loop().create_task(self._heartbeat_loop())
        return self

    async def register(self) -> None:
        assert self._channel is not None
        stub = pbgrpc.ControllerServiceStub(self._channel)
        await stub.RegisterNode(pb.RegisterNodeRequest(node=self.spec()), metadata=call_metadata(KEY), timeout=5)
        self.registrations += 1

    def frame(self, seq: int) -> pb.HeartbeatRequest:
        running = self.state in (pb.NODE_STATE_RUNNING, pb.NODE_STATE_PAUSED)
        return pb.HeartbeatRequest(
            node_id=self.node_id,
            sequence=seq,
            state=self.state,
            instance_id=self.instance_id,
            endpoints=[pb.EndpointHealth(endpoint_id=i, status=self.endpoint_status) for i in range(self.eps)]
            if running
            else [],
        )

    async def _heartbeat_loop(self) -> None:
        assert self._channel is not None
        stub = pbgrpc.ControllerServiceStub(self._channel)
        seq = itertools.count(1)
        while True:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self._stream_once(stub, seq)
            await asyncio.sleep(self.interval)

    async def _stream_once(self, stub: pbgrpc.ControllerServiceStub, seq: itertools.count[int]) -> None:
        queue: asyncio.Queue[pb.HeartbeatRequest] = asyncio.Queue()

        async def frames() -> AsyncIterator[pb.HeartbeatRequest]:
            while True:
                yield await queue.get()

        async def produce() -> None:
            while True:
                if self.heartbeating:
                    queue.put_nowait(self.frame(next(seq)))
                await asyncio.sleep(self.interval)

        call = stub.Heartbeat(frames(), metadata=call_metadata(KEY))
        producer = asyncio.get_running_loop().create_task(produce())
        try:
            async for ack in call:
                if ack.command == pb.HEARTBEAT_COMMAND_REREGISTER:
                    self.reregister_commands += 1
                    await self.register()
        finally:
            producer.cancel()
            call.cancel()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._channel is not None:
            await self._channel.close()
        if self._server is not None:
            await self._server.stop(0)


def controller_config(tmp_path: Path, coordinators: list[str] | None = None, **kw: Any) -> Any:
    from motor_controller.config import ControllerConfig, StoreConfig

    key_file = tmp_path / "mgmt.key"
    key_file.write_text(KEY + "\n")
    base: dict[str, Any] = dict(
        server=ServerConfig(port=0, management_key_file=str(key_file), grace_seconds=0.5),
        coordinators=coordinators or [],
        heartbeat_interval_sec=0.1,
        heartbeat_timeout_sec=0.6,
        reconcile_interval_sec=0.1,
        sync_interval_sec=1.0,
        set_retry_interval_sec=0.2,
        rpc_timeout_sec=2.0,
        start_retry_interval_sec=1.0,
        store=StoreConfig(path=str(tmp_path / "controller.db")),
    )
    base.update(kw)
    return ControllerConfig(**base)


@dataclass
class RunningController:
    controller: Any
    server: GrpcServer
    store: Any
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        await self.server.set_serving(False)
        await self.controller.close()
        await self.server.stop(0)
        await self.store.close()


async def start_controller_inproc(config: Any, port: int = 0) -> RunningController:
    from dataclasses import replace

    from motor_controller.controller import Controller
    from motor_controller.main import build_server
    from motor_controller.peers import GrpcCoordinator, GrpcNodeManagers
    from motor_controller.store import open_store

    if port:
        config = replace(config, server=replace(config.server, port=port))
    store = await open_store("embedded", config.store.path)
    ctl = Controller(
        config,
        store,
        GrpcNodeManagers(KEY, config.rpc_timeout_sec),
        [GrpcCoordinator(a, KEY, config.rpc_timeout_sec) for a in config.coordinators],
    )
    await ctl.load()
    server = build_server(config, ctl, KEY)
    bound = await server.start()
    ctl.start()
    return RunningController(ctl, server, store, bound)
