"""An in-process fake coordinator (real gRPC chassis, scripted DispatchService) and a gateway runner."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import orjson

from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_server import GrpcServer, ServerConfig
from motor_common.tls import TlsConfig
from motor_gateway.config import GatewayConfig
from motor_gateway.main import serve
from tests.helpers import wait_for

DISPATCH = "motor.coordinator.v1.DispatchService"
Script = Callable[[cpb.DispatchRequest, Any], AsyncIterator[cpb.DispatchResponse]]


def head(status: int = 200, ctype: str = "application/json") -> cpb.DispatchResponse:
    return cpb.DispatchResponse(head=cpb.ResponseHead(http_status=status, content_type=ctype))


def chunk(data: bytes) -> cpb.DispatchResponse:
    return cpb.DispatchResponse(chunk=data)


def replay(*frames: cpb.DispatchResponse) -> Script:
    async def script(request: cpb.DispatchRequest, context: Any) -> AsyncIterator[cpb.DispatchResponse]:
        for frame in frames:
            yield frame

    return script


def failing(exc: BaseException, *before: cpb.DispatchResponse) -> Script:
    async def script(request: cpb.DispatchRequest, context: Any) -> AsyncIterator[cpb.DispatchResponse]:
        for frame in before:
            yield frame
        raise exc

    return script


def hanging(*before: cpb.DispatchResponse) -> Script:
    async def script(request: cpb.DispatchRequest, context: Any) -> AsyncIterator[cpb.DispatchResponse]:
        for frame in before:
            yield frame
        await asyncio.Event().wait()

    return script


@dataclass
class FakeDispatch(cgrpc.DispatchServiceServicer):
    script: Script = field(default_factory=lambda: replay(head(), chunk(b'{"ok": true}')))
    ready: bool = True
    reason: str = ""
    role: int = cpb.COORDINATOR_ROLE_STANDALONE
    models: list[str] = field(default_factory=lambda: ["tiny"])
    requests: list[cpb.DispatchRequest] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    # GetReadiness fails with this status and message (a coordinator that refuses the probe).
    refuse: tuple[grpc.StatusCode, str] | None = None

    async def Dispatch(self, request: cpb.DispatchRequest, context: Any) -> AsyncIterator[cpb.DispatchResponse]:
        self.requests.append(request)
        self.metadata.append({k: v for k, v in context.invocation_metadata() if isinstance(v, str)})
        try:
            async for frame in self.script(request, context):
                yield frame
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def DispatchMany(self, requests: Any, context: Any) -> AsyncIterator[cpb.DispatchManyResponse]:
        """No DispatchMany, as an older coordinator: UNIMPLEMENTED, and the gateway falls back to a
        Dispatch call per request. Said with an explicit abort: the generated base method raises
        NotImplementedError, which grpc.aio turns into INTERNAL ("Internal error from Core") about
        once in 300 streams instead of UNIMPLEMENTED (a 502 in a test that expected a fallback)."""
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        yield cpb.DispatchManyResponse()  # pragma: no cover (makes this an async generator)

    async def ListModels(self, request: cpb.ListModelsRequest, context: Any) -> cpb.ListModelsResponse:
        return cpb.ListModelsResponse(
            models=[cpb.Model(id=m, created=1_700_000_000, prefill_instances=1, decode_instances=1) for m in self.models]
        )

    async def GetReadiness(self, request: cpb.GetReadinessRequest, context: Any) -> cpb.GetReadinessResponse:
        if self.refuse is not None:
            await context.abort(*self.refuse)
        return cpb.GetReadinessResponse(ready=self.ready, reason=self.reason, role=self.role,
                                        store_available=True)


@contextlib.asynccontextmanager
async def fake_coordinator(tls: TlsConfig | None = None) -> AsyncIterator[tuple[str, FakeDispatch]]:
    impl = FakeDispatch()
    server = GrpcServer("fake-coordinator", ServerConfig(tls=tls) if tls else ServerConfig())
    server.add_service(DISPATCH, lambda s: cgrpc.add_DispatchServiceServicer_to_server(impl, s))
    port = await server.start()
    try:
        yield f"127.0.0.1:{port}", impl
    finally:
        await server.stop(0)


@contextlib.asynccontextmanager
async def running_gateway(cfg: GatewayConfig, tmp_path: Path) -> AsyncIterator[str]:
    """Run :func:`motor_gateway.main.serve` in this loop; yields the base URL."""
    ports_file = tmp_path / f"gw-{id(cfg)}.ports"
    stop = asyncio.Event()
    task = asyncio.create_task(serve(replace(cfg, port=0), str(ports_file), stop=stop))
    try:
        await wait_for(lambda: ports_file.exists() or task.done(), timeout=10, what="gateway ports file")
        if task.done():
            task.result()
        port = orjson.loads(ports_file.read_bytes())["http"]
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


class ScriptedBackend:
    """The in-process client's backend (motor_coordinator.http_front.DispatchBackend) running a
    :class:`FakeDispatch`'s scripts: the same frames and exceptions as the gRPC fake, no gRPC."""

    def __init__(self, fake: FakeDispatch) -> None:
        self.fake = fake

    def frames(self, api: str, body: dict[str, Any], request_id: str) -> AsyncIterator[Any]:
        from motor_coordinator.dispatcher import Head

        fake = self.fake
        request = cpb.DispatchRequest(
            request_id=request_id, body=orjson.dumps(body),
            api=cpb.OPEN_AI_API_CHAT_COMPLETIONS if api == "chat" else cpb.OPEN_AI_API_COMPLETIONS)
        fake.requests.append(request)
        fake.metadata.append({"x-request-id": request_id})

        async def gen() -> AsyncIterator[Any]:
            try:
                async for frame in fake.script(request, None):
                    if frame.HasField("head"):
                        yield Head(frame.head.http_status, frame.head.content_type, request_id)
                    else:
                        yield frame.chunk
            except (asyncio.CancelledError, GeneratorExit):
                fake.cancelled.set()
                raise

        return gen()

    def models(self) -> list[Any]:
        from motor_common.openai_front.dispatch import ModelInfo

        return [ModelInfo(m, 1_700_000_000) for m in self.fake.models]

    def readiness(self) -> Any:
        from motor_common.openai_front.dispatch import Readiness

        f = self.fake
        return Readiness(f.ready, "ok" if f.ready else (f.reason or "not ready"), "in-process")


@contextlib.asynccontextmanager
async def in_process_gateway(request_timeout: float = 5.0, limits: Any = None,
                             admission: Any = None) -> AsyncIterator[tuple[str, FakeDispatch]]:
    """The co-located front (motor_coordinator.http_front.HttpFront) over a scripted backend."""
    from motor_coordinator.http_front import HttpFront

    fake = FakeDispatch()
    front = HttpFront(ScriptedBackend(fake), "127.0.0.1", 0, request_timeout=request_timeout, shutdown_timeout=1,
                      limits=limits, admission=admission)
    port = await front.start()
    try:
        yield f"http://127.0.0.1:{port}", fake
    finally:
        await front.stop()
