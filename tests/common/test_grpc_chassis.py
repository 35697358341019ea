"""The gRPC chassis: health, reflection, management key, error translation, request ids."""

from __future__ import annotations

import asyncio
import gc
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from motor_common.credentials import AuthConfig, Role
from motor_common.errors import NotFound
from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.controller.v1 import controller_pb2 as ctlpb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as ctlgrpc
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_client import call_metadata, open_channel, translate
from motor_common.grpc_server import (
    LIVENESS_SERVICE,
    RPC_HANDLED,
    GrpcServer,
    ServerConfig,
    error_reason,
)
from motor_common.logs import request_id_var
from tests.conftest import tool
from tests.helpers import varint, wait_for

REGISTRY = "motor.coordinator.v1.InstanceRegistryService"
DISPATCH = "motor.coordinator.v1.DispatchService"


class FakeRegistry(cgrpc.InstanceRegistryServiceServicer):
    def __init__(self) -> None:
        self.sets = 0
        self.request_ids: list[str] = []

    async def SetInstances(self, request: cpb.SetInstancesRequest, context: object) -> cpb.SetInstancesResponse:
        self.sets += 1
        self.request_ids.append(request_id_var.get())
        return cpb.SetInstancesResponse(generation=self.sets)

    async def GetInstance(self, request: cpb.GetInstanceRequest, context: object) -> cpb.GetInstanceResponse:
        raise NotFound(f"instance {request.instance_id} is not registered", reason="INSTANCE_NOT_FOUND")


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[int, FakeRegistry]]:
    key_file = tmp_path / "key"
    key_file.write_text("s3cret\n")
    impl = FakeRegistry()
    server = GrpcServer("test", ServerConfig(management_key_file=str(key_file)))
    server.add_service(REGISTRY, lambda s: cgrpc.add_InstanceRegistryServiceServicer_to_server(impl, s), protected=True)
    server.add_service(DISPATCH, lambda s: cgrpc.add_DispatchServiceServicer_to_server(cgrpc.DispatchServiceServicer(), s))
    port = await server.start()
    yield port, impl
    await server.stop(0)


async def test_health_reports_serving_for_server_and_each_service(served: tuple[int, FakeRegistry]) -> None:
    port, _ = served
    async with open_channel(f"127.0.0.1:{port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for name in ("", REGISTRY, DISPATCH):
            resp = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING


async def test_liveness_stays_serving_when_readiness_goes_not_serving(tmp_path: Path) -> None:
    server = GrpcServer("test", ServerConfig())
    server.add_service(DISPATCH, lambda s: cgrpc.add_DispatchServiceServicer_to_server(cgrpc.DispatchServiceServicer(), s))
    port = await server.start()
    try:
        async with open_channel(f"127.0.0.1:{port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)

            async def status(name: str) -> int:
                resp = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
                return int(resp.status)

            assert await status(LIVENESS_SERVICE) == health_pb2.HealthCheckResponse.SERVING
            await server.set_serving(False)  # a standby: not ready, but alive
            assert await status("") == health_pb2.HealthCheckResponse.NOT_SERVING
            assert await status(DISPATCH) == health_pb2.HealthCheckResponse.NOT_SERVING
            assert await status(LIVENESS_SERVICE) == health_pb2.HealthCheckResponse.SERVING
            await server.set_serving(True)
            assert await status("") == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(0)


async def test_missing_or_wrong_management_key_is_unauthenticated_and_changes_nothing(
    served: tuple[int, FakeRegistry],
) -> None:
    port, impl = served
    async with open_channel(f"127.0.0.1:{port}") as ch:
        stub = cgrpc.InstanceRegistryServiceStub(ch)
        for md in ((), call_metadata("wrong")):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.SetInstances(cpb.SetInstancesRequest(), metadata=md, timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert error_reason(err.value) == "MANAGEMENT_KEY_REQUIRED"
        assert impl.sets == 0
        resp = await stub.SetInstances(cpb.SetInstancesRequest(), metadata=call_metadata("s3cret", "rid-1"), timeout=5)
        assert resp.generation == 1
        assert impl.request_ids == ["rid-1"]


async def test_motor_errors_become_status_with_error_info(served: tuple[int, FakeRegistry]) -> None:
    port, _ = served
    async with open_channel(f"127.0.0.1:{port}") as ch:
        stub = cgrpc.InstanceRegistryServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetInstance(cpb.GetInstanceRequest(instance_id=7), metadata=call_metadata("s3cret"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert err.value.details() == "instance 7 is not registered"
        assert error_reason(err.value) == "INSTANCE_NOT_FOUND"
        assert isinstance(translate(err.value), NotFound)


async def test_unimplemented_rpc_answers_unimplemented(served: tuple[int, FakeRegistry]) -> None:
    port, _ = served
    async with open_channel(f"127.0.0.1:{port}") as ch:
        stub = cgrpc.DispatchServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ListModels(cpb.ListModelsRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_grpcurl_lists_services_through_reflection(served: tuple[int, FakeRegistry]) -> None:
    port, _ = served
    proc = await asyncio.create_subprocess_exec(
        tool("grpcurl"), "-plaintext", f"127.0.0.1:{port}", "list", stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, err.decode()
    names = set(out.decode().split())
    assert {REGISTRY, DISPATCH, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
            "grpc.reflection.v1.ServerReflection"} <= names, names


async def test_grpcurl_describe_shows_the_proto_comments(served: tuple[int, FakeRegistry]) -> None:
    port, _ = served
    proc = await asyncio.create_subprocess_exec(
        tool("grpcurl"), "-plaintext", f"127.0.0.1:{port}", "describe", "motor.common.v1.Instance",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, err.decode()
    # The field comment from protos/motor/common/v1/types.proto, served through reflection.
    assert "Served model name, as clients send it in" in out.decode()
    assert "string model_name = 4;" in out.decode()


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
async def test_reflection_v1_and_v1alpha_answer_with_source_comments(
    served: tuple[int, FakeRegistry], version: str,
) -> None:
    from google.protobuf import descriptor_pb2
    from grpc_reflection.v1alpha import reflection_pb2 as rpb  # v1 is wire-identical

    port, _ = served
    async with open_channel(f"127.0.0.1:{port}") as ch:
        call = ch.stream_stream(
            f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
            request_serializer=rpb.ServerReflectionRequest.SerializeToString,
            response_deserializer=rpb.ServerReflectionResponse.FromString,
        )
        requests = [rpb.ServerReflectionRequest(list_services=""),
                    rpb.ServerReflectionRequest(file_containing_symbol=REGISTRY),
                    rpb.ServerReflectionRequest(file_containing_symbol="motor.NoSuchThing"),
                    rpb.ServerReflectionRequest(file_by_filename="grpc/reflection/v1/reflection.proto")]
        answers = [a async for a in call(iter(requests), timeout=10)]
    assert len(answers) == 4
    listed = {s.name for s in answers[0].list_services_response.service}
    assert {REGISTRY, DISPATCH, "grpc.reflection.v1.ServerReflection"} <= listed
    files = [descriptor_pb2.FileDescriptorProto.FromString(b)
             for b in answers[1].file_descriptor_response.file_descriptor_proto]
    assert [f.name for f in files][:2] == ["motor/coordinator/v1/coordinator.proto", "motor/common/v1/types.proto"]
    comments = [loc.leading_comments for loc in files[0].source_code_info.location]
    assert any("management key" in c for c in comments)
    assert answers[2].error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
    v1 = descriptor_pb2.FileDescriptorProto.FromString(answers[3].file_descriptor_response.file_descriptor_proto[0])
    assert v1.package == "grpc.reflection.v1" and v1.service[0].name == "ServerReflection"


async def test_unknown_fields_are_rejected_with_their_path_and_change_nothing(
    served: tuple[int, FakeRegistry],
) -> None:
    port, impl = served
    # A client built from a newer proto: field 99 inside the first instance, unknown to this server.
    inst = tpb.Instance(id=1).SerializeToString() + bytes([0x98, 0x06, 0x01])
    raw = bytes([0x0A, len(inst)]) + inst
    async with open_channel(f"127.0.0.1:{port}") as ch:
        call = ch.unary_unary(
            f"/{REGISTRY}/SetInstances",
            request_serializer=lambda b: b,
            response_deserializer=cpb.SetInstancesResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(raw, metadata=call_metadata("s3cret"), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(err.value) == "UNKNOWN_FIELD"
    assert "SetInstancesRequest.instances[0].#99" in (err.value.details() or "")
    assert impl.sets == 0


class EchoController(ctlgrpc.ControllerServiceServicer):
    def __init__(self) -> None:
        self.frames = 0

    async def Heartbeat(self, requests: AsyncIterator[ctlpb.HeartbeatRequest], context: object) -> AsyncIterator[ctlpb.HeartbeatResponse]:
        async for frame in requests:
            self.frames += 1
            yield ctlpb.HeartbeatResponse(acked_sequence=frame.sequence)


async def test_a_stream_frame_with_unknown_fields_ends_the_stream_with_invalid_argument() -> None:
    impl = EchoController()
    server = GrpcServer("test", ServerConfig())
    server.add_service("motor.controller.v1.ControllerService",
                       lambda s: ctlgrpc.add_ControllerServiceServicer_to_server(impl, s))
    port = await server.start()
    good = ctlpb.HeartbeatRequest(node_id="n", sequence=1).SerializeToString()
    bad = ctlpb.HeartbeatRequest(node_id="n", sequence=2).SerializeToString() + bytes([0x98, 0x06, 0x01])

    async def frames() -> AsyncIterator[bytes]:
        yield good
        yield bad

    try:
        async with open_channel(f"127.0.0.1:{port}") as ch:
            call = ch.stream_stream("/motor.controller.v1.ControllerService/Heartbeat",
                                    request_serializer=lambda b: b,
                                    response_deserializer=ctlpb.HeartbeatResponse.FromString)
            acks = []
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for ack in call(frames(), timeout=5):
                    acks.append(ack.acked_sequence)
        assert acks == [1] and impl.frames == 1
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "HeartbeatRequest.#99" in (err.value.details() or "")
    finally:
        await server.stop(0)


class _Broken(cgrpc.InstanceRegistryServiceServicer):
    async def GetInstance(self, request: cpb.GetInstanceRequest, context: object) -> cpb.GetInstanceResponse:
        raise RuntimeError("secret detail at 10.1.2.3:8000")

    async def AddInstances(self, request: cpb.AddInstancesRequest, context: object) -> cpb.AddInstancesResponse:
        raise AssertionError("the bounds check must refuse this before the handler")


async def test_internal_errors_name_the_request_id_not_the_exception(caplog: pytest.LogCaptureFixture) -> None:
    server = GrpcServer("test", ServerConfig())
    server.add_service(REGISTRY, lambda s: cgrpc.add_InstanceRegistryServiceServicer_to_server(_Broken(), s))
    port = await server.start()
    try:
        async with open_channel(f"127.0.0.1:{port}") as ch:
            stub = cgrpc.InstanceRegistryServiceStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetInstance(cpb.GetInstanceRequest(instance_id=5), metadata=call_metadata(request_id="rid-7"),
                                       timeout=5)
            assert err.value.code() == grpc.StatusCode.INTERNAL
            details = err.value.details() or ""
            assert "rid-7" in details and "RuntimeError" not in details and "10.1.2.3" not in details
            assert "secret detail" in caplog.text and "rid-7" in caplog.text
            # Out-of-range input never reaches the handler: ids start at 1.
            bad = tpb.Instance(id=0, role=tpb.ROLE_UNION, job_name="j", model_name="m",
                               endpoints=[tpb.Endpoint(ip="127.0.0.1", business_port=8000)])
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.AddInstances(cpb.AddInstancesRequest(instances=[bad]), timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error_reason(err.value) == "OUT_OF_RANGE" and "instance ids start at 1" in (err.value.details() or "")
    finally:
        await server.stop(0)


class _Dispatch(cgrpc.DispatchServiceServicer):
    def __init__(self) -> None:
        self.calls = 0

    async def Dispatch(self, request: cpb.DispatchRequest, context: object) -> AsyncIterator[cpb.DispatchResponse]:
        self.calls += 1
        yield cpb.DispatchResponse(chunk=request.body)


async def test_a_caller_without_a_key_is_refused_before_its_request_is_read(tmp_path: Path) -> None:
    """The request of a protected method is read only after the key is checked: bytes that are no
    protobuf at all (standing for a huge request that would take seconds and gigabytes to parse)
    sent without a key are answered UNAUTHENTICATED, never parsed; with the key the same methods
    serve."""
    (tmp_path / "op").write_text("s3cret-op\n")
    (tmp_path / "inf").write_text("app: s3cret-inference\n")
    registry, dispatch = FakeRegistry(), _Dispatch()
    server = GrpcServer("test", ServerConfig(auth=AuthConfig(operator_keys_file=str(tmp_path / "op"),
                                                             inference_keys_file=str(tmp_path / "inf"))))
    server.add_service(REGISTRY, lambda s: cgrpc.add_InstanceRegistryServiceServicer_to_server(registry, s),
                       protected=True)
    server.add_service(DISPATCH, lambda s: cgrpc.add_DispatchServiceServicer_to_server(dispatch, s),
                       role=Role.INFERENCE, open_methods=("GetReadiness",))
    port = await server.start()
    garbage = b"\xff\xff\xff\xff"
    try:
        async with open_channel(f"127.0.0.1:{port}") as ch:
            set_raw = ch.unary_unary(f"/{REGISTRY}/SetInstances", request_serializer=lambda b: b)
            dispatch_raw = ch.unary_stream(f"/{DISPATCH}/Dispatch", request_serializer=lambda b: b)
            for md in ((), call_metadata("wrong-key-1")):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await set_raw(garbage, metadata=md, timeout=5)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert error_reason(err.value) == "MANAGEMENT_KEY_REQUIRED"
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    async for _ in dispatch_raw(garbage, metadata=md, timeout=5):
                        pass
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert registry.sets == 0 and dispatch.calls == 0
            resp = await cgrpc.InstanceRegistryServiceStub(ch).SetInstances(
                cpb.SetInstancesRequest(), metadata=call_metadata("s3cret-op"), timeout=5)
            assert resp.generation == 1
            frames = [f async for f in cgrpc.DispatchServiceStub(ch).Dispatch(
                cpb.DispatchRequest(body=b"{}"), metadata=(("authorization", "Bearer s3cret-inference"),), timeout=5)]
            assert [f.chunk for f in frames] == [b"{}"] and dispatch.calls == 1
    finally:
        await server.stop(0)



async def test_health_watch_streams_the_status_and_its_changes() -> None:
    """grpc.health.v1.Health/Watch (whose handler writes with context.write instead of yielding)
    streams SERVING, then NOT_SERVING when the server stops being ready."""
    server = GrpcServer("test", ServerConfig())
    server.add_service(DISPATCH, lambda s: cgrpc.add_DispatchServiceServicer_to_server(cgrpc.DispatchServiceServicer(), s))
    port = await server.start()
    try:
        async with open_channel(f"127.0.0.1:{port}") as ch:
            watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=DISPATCH), timeout=10)
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            await server.set_serving(False)
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
            watch.cancel()
    finally:
        await server.stop(0)


async def test_bytes_that_are_no_protobuf_message_are_invalid_argument_without_internals(
    served: tuple[int, FakeRegistry],
) -> None:
    """A request that does not parse is INVALID_ARGUMENT (reason MALFORMED_REQUEST) naming no Python
    exception, on protected and open methods, unary and streaming, and changes nothing."""
    port, impl = served
    garbage = b"\xff\xff\xff\xff"
    async with open_channel(f"127.0.0.1:{port}") as ch:
        calls = [
            (ch.unary_unary(f"/{REGISTRY}/SetInstances", request_serializer=lambda b: b), call_metadata("s3cret")),
            (ch.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda b: b), ()),
        ]
        for call, md in calls:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call(garbage, metadata=md, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error_reason(err.value) == "MALFORMED_REQUEST"
            assert "DecodeError" not in (err.value.details() or "") and "class" not in (err.value.details() or "")
        watch = ch.unary_stream("/grpc.health.v1.Health/Watch", request_serializer=lambda b: b)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in watch(garbage, timeout=5):
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert impl.sets == 0
        resp = await cgrpc.InstanceRegistryServiceStub(ch).SetInstances(
            cpb.SetInstancesRequest(), metadata=call_metadata("s3cret"), timeout=5)
        assert resp.generation == 1


class _Endless(cgrpc.DispatchServiceServicer):
    def __init__(self) -> None:
        self.closed = asyncio.Event()

    async def Dispatch(self, request: cpb.DispatchRequest, context: object) -> AsyncIterator[cpb.DispatchResponse]:
        try:
            while True:  # no await between chunks: cancelled while suspended at its yield
                yield cpb.DispatchResponse(chunk=b"x" * 65536)
        finally:
            self.closed.set()


async def test_a_stream_the_caller_cancels_is_counted_cancelled_and_logs_no_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The handler's generator is closed (its cleanup runs), the call is counted CANCELLED (not
    OK), and closing it outside the call's context logs no "Task exception was never retrieved"."""
    # garbage of earlier tests in this process (an HTTP client closed after its loop ended) logs
    # its own "Task exception was never retrieved" when collected: collect it before, not below
    gc.collect()
    await asyncio.sleep(0)
    caplog.clear()
    impl = _Endless()
    server = GrpcServer("test", ServerConfig())
    server.add_service(DISPATCH, lambda s: cgrpc.add_DispatchServiceServicer_to_server(impl, s))
    port = await server.start()
    cancelled = RPC_HANDLED.labels(DISPATCH, "Dispatch", "CANCELLED")
    before = cancelled._value.get()
    try:
        async with open_channel(f"127.0.0.1:{port}") as ch:
            call = cgrpc.DispatchServiceStub(ch).Dispatch(cpb.DispatchRequest(body=b"{}"), timeout=10)
            assert len((await call.read()).chunk) == 65536
            call.cancel()
            await asyncio.wait_for(impl.closed.wait(), 10)
        await wait_for(lambda: cancelled._value.get() == before + 1, timeout=10, what="the call counted CANCELLED")
        gc.collect()
        await asyncio.sleep(0)
        assert "was created in a different Context" not in caplog.text
        assert "Task exception was never retrieved" not in caplog.text
    finally:
        await server.stop(0)


async def test_many_unknown_fields_are_named_in_a_bounded_message(served: tuple[int, FakeRegistry]) -> None:
    """A message with thousands of unknown fields is refused with the first few named and a count:
    the status detail stays small enough for every client to receive it (trailers are bounded)."""
    port, impl = served
    inst = tpb.Instance(id=1).SerializeToString() + bytes([0x98, 0x06, 0x01]) * 3000  # field 99, 3,000 times
    raw = b"\x0a" + varint(len(inst)) + inst
    async with open_channel(f"127.0.0.1:{port}") as ch:
        call = ch.unary_unary(f"/{REGISTRY}/SetInstances", request_serializer=lambda b: b,
                              response_deserializer=cpb.SetInstancesResponse.FromString)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(raw, metadata=call_metadata("s3cret"), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(err.value) == "UNKNOWN_FIELD"
    details = err.value.details() or ""
    assert "SetInstancesRequest.instances[0].#99" in details and "3000 in all" in details
    assert len(details) < 2000
    assert impl.sets == 0
