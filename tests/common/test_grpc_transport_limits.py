"""The chassis' transport bounds (``ServerConfig.max_*``): calls held open, streams per connection,
connections, idle connections and connections that never start HTTP/2, against a real server
with real clients (raw sockets where the client must misbehave)."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_client import open_channel
from motor_common.grpc_server import GrpcServer, ServerConfig
from tests.helpers import wait_for

DISPATCH = "motor.coordinator.v1.DispatchService"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
SETTINGS, GOAWAY = 0x4, 0x7
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3


@contextlib.asynccontextmanager
async def serving(**limits: float) -> AsyncIterator[int]:
    server = GrpcServer("test", ServerConfig(**limits))  # type: ignore[arg-type]
    server.add_service(DISPATCH, lambda s: cgrpc.add_DispatchServiceServicer_to_server(cgrpc.DispatchServiceServicer(), s))
    port = await server.start()
    try:
        yield port
    finally:
        await server.stop(0)


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readexactly(9)
    return head[3], await reader.readexactly(int.from_bytes(head[:3], "big"))


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> list[int]:
    """The frame types received until the server closed the connection (TimeoutError if it did not)."""
    types = []
    async with asyncio.timeout(seconds):
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionResetError):
            while True:
                ftype, _ = await read_frame(reader)
                types.append(ftype)
    return types


async def test_calls_beyond_the_servers_limit_are_refused_and_served_again_once_calls_end() -> None:
    """One client holding calls open (here health watches, which need no key) cannot take more than
    ``max_concurrent_rpcs``: the next call is RESOURCE_EXHAUSTED, and served once they end."""
    async with serving(max_concurrent_rpcs=4) as port, open_channel(f"127.0.0.1:{port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        watches = [stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30) for _ in range(4)]
        for w in watches:
            assert (await w.read()).status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        for w in watches:
            w.cancel()

        async def served() -> bool:
            resp = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)

        await wait_for(served, timeout=10, what="a call once the held ones ended")


async def test_the_server_announces_its_streams_per_connection_limit() -> None:
    """HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS is the configured limit: gRPC clients queue beyond
    it, and a client that ignores it has its extra streams refused by the transport."""
    async with serving(max_streams_per_connection=7) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(PREFACE + EMPTY_SETTINGS)
            async with asyncio.timeout(5):
                ftype, payload = await read_frame(reader)
            assert ftype == SETTINGS
            settings = dict(struct.unpack(">HI", payload[i:i + 6]) for i in range(0, len(payload), 6))
            assert settings.get(SETTINGS_MAX_CONCURRENT_STREAMS) == 7
        finally:
            writer.close()


async def test_a_connection_that_never_starts_http2_is_closed_after_the_handshake_timeout() -> None:
    async with serving(handshake_timeout_sec=0.5) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            await closed_within(reader, 10)  # grpc's own default kept it ~70 s
        finally:
            writer.close()


async def test_an_idle_connection_is_sent_goaway_and_closed() -> None:
    async with serving(max_connection_idle_sec=0.5) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(PREFACE + EMPTY_SETTINGS)
            assert GOAWAY in await closed_within(reader, 10)
        finally:
            writer.close()


async def test_connections_beyond_the_limit_are_closed_and_the_others_keep_serving() -> None:
    async with serving(max_connections=2) as port:
        opened = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        try:
            for reader, writer in opened:
                writer.write(PREFACE + EMPTY_SETTINGS)
                async with asyncio.timeout(5):
                    assert (await read_frame(reader))[0] == SETTINGS
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            opened.append((reader, writer))
            writer.write(PREFACE + EMPTY_SETTINGS)
            await closed_within(reader, 5)
            assert not any(r.at_eof() for r, _ in opened[:2])
        finally:
            for _, writer in opened:
                writer.close()


@pytest.mark.parametrize("field, value", [("max_concurrent_rpcs", 0), ("max_streams_per_connection", -1),
                                          ("max_connections", 0), ("max_connection_idle_sec", 0.0),
                                          ("handshake_timeout_sec", float("inf"))])
def test_transport_limits_out_of_range_are_refused_at_start(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        ServerConfig(**{field: value})  # type: ignore[arg-type]
