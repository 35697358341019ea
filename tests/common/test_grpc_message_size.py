"""Request message size: the controller and nodemanagers receive at most 4 MiB (every byte of a
message can be a nested message to parse), the coordinator's Dispatch whole request bodies (64 MiB)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as pbgrpc
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_client import call_metadata, open_channel
from motor_common.grpc_server import ServerConfig, error_reason
from motor_coordinator.app import Coordinator
from motor_coordinator.config import CoordinatorConfig, DispatchConfig
from tests.controller.fakes import KEY as CTL_KEY
from tests.controller.fakes import controller_config, start_controller_inproc
from tests.coordinator.grpc_util import KEY, Stubs


async def test_the_controller_refuses_a_request_over_4_mib_before_parsing_it(tmp_path: Path) -> None:
    ctl = await start_controller_inproc(controller_config(tmp_path))
    try:
        async with open_channel(ctl.address) as ch:
            endpoints = [tpb.Endpoint(id=i, ip="1" * 4000, business_port=8000) for i in range(1100)]
            spec = pb.NodeSpec(node_id="n1", job_name="j", role=tpb.ROLE_UNION, ip="127.0.0.1", admin_port=9300,
                               model_name="m", nodes_per_instance=1, endpoints=endpoints)
            request = pb.RegisterNodeRequest(node=spec)
            assert request.ByteSize() > 4 * 1024 * 1024
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await pbgrpc.ControllerServiceStub(ch).RegisterNode(request, metadata=call_metadata(CTL_KEY), timeout=10)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            nodes = await pbgrpc.ControllerAdminServiceStub(ch).ListNodes(
                pb.ListNodesRequest(), metadata=call_metadata(CTL_KEY), timeout=5)
            assert list(nodes.nodes) == []
    finally:
        await ctl.stop()


async def test_the_coordinator_still_receives_a_dispatch_body_over_4_mib() -> None:
    cfg = CoordinatorConfig(server=ServerConfig(port=0),
                            dispatch=DispatchConfig(health_probe_interval_sec=0, metrics_scrape_interval_sec=0))
    app = Coordinator(cfg, management_key=KEY)
    port = await app.start()
    stubs = Stubs(f"127.0.0.1:{port}")
    try:
        await stubs.set()  # an instance set, without this model
        body = b'{"model": "no-such-model", "prompt": "' + b"x" * (5 * 1024 * 1024) + b'"}'
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stubs.dispatch.Dispatch(
                    cpb.DispatchRequest(api=cpb.OPEN_AI_API_COMPLETIONS, body=body), timeout=10):
                pass
        # Received and looked at: the model has no instances (not refused for its size).
        assert err.value.code() != grpc.StatusCode.RESOURCE_EXHAUSTED, err.value.details()
        assert "no-such-model" in (err.value.details() or "")
    finally:
        await stubs.close()
        await app.stop(0)


async def test_a_request_with_more_fields_than_allowed_is_refused_before_it_is_parsed() -> None:
    """One DispatchMany frame of 1 MiB of empty commands (half a million messages, 64 MiB would be
    30 million: 40 s of the event loop and 1.6 GB) is counted on the wire and refused; a gateway's
    batch passes; the coordinator keeps serving."""
    cfg = CoordinatorConfig(server=ServerConfig(port=0),
                            dispatch=DispatchConfig(health_probe_interval_sec=0, metrics_scrape_interval_sec=0))
    app = Coordinator(cfg, management_key=KEY)
    port = await app.start()
    try:
        async with open_channel(f"127.0.0.1:{port}") as ch:
            many = ch.stream_stream("/motor.coordinator.v1.DispatchService/DispatchMany",
                                    request_serializer=lambda b: b, response_deserializer=lambda b: b)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in many(iter([b"\x0a\x00" * (512 * 1024)]), timeout=10):
                    pass
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error_reason(err.value) == "TOO_MANY_FIELDS"
            assert "more than 50000 fields" in (err.value.details() or "")
            readiness = await cgrpc.DispatchServiceStub(ch).GetReadiness(cpb.GetReadinessRequest(), timeout=5)
            assert readiness.role == cpb.COORDINATOR_ROLE_STANDALONE
    finally:
        await app.stop(0)


async def test_an_operator_can_lower_the_coordinators_message_size() -> None:
    """``server.max_message_bytes`` (e.g. the gateways' body limit plus room): a larger Dispatch is
    RESOURCE_EXHAUSTED; the same body under it is served as before."""
    cfg = CoordinatorConfig(server=ServerConfig(port=0, max_message_bytes=2 * 1024 * 1024),
                            dispatch=DispatchConfig(health_probe_interval_sec=0, metrics_scrape_interval_sec=0))
    app = Coordinator(cfg, management_key=KEY)
    port = await app.start()
    stubs = Stubs(f"127.0.0.1:{port}")
    try:
        await stubs.set()
        for size, refused in ((3 * 1024 * 1024, True), (1024 * 1024, False)):
            body = b'{"model": "no-such-model", "prompt": "' + b"x" * size + b'"}'
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in stubs.dispatch.Dispatch(cpb.DispatchRequest(api=cpb.OPEN_AI_API_COMPLETIONS, body=body),
                                                       timeout=10):
                    pass
            assert (err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED) is refused, err.value.details()
    finally:
        await stubs.close()
        await app.stop(0)


def test_a_message_size_outside_its_range_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="max_message_bytes"):
        ServerConfig(max_message_bytes=100)
