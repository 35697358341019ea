"""Fixtures for nodemanager integration tests: a fake controller, a config builder and raw engine
servers (a handler per connection: answers a real engine would not give)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from motor_common.domain import Endpoint
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2_grpc as pbg
from motor_common.grpc_client import call_metadata, open_channel
from motor_common.grpc_server import GrpcServer
from tests.nodemanager.fake_controller import FakeController, serve_fake_controller

KEY = "nm-test-key"


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def engine() -> AsyncIterator[Callable[[Handler], Awaitable[Endpoint]]]:
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> Endpoint:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(server)
        return Endpoint(0, "127.0.0.1", server.sockets[0].getsockname()[1])

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def key_file(tmp_path: Path) -> str:
    p = tmp_path / "mgmt.key"
    p.write_text(KEY + "\n")
    return str(p)


@pytest.fixture
async def controller() -> AsyncIterator[tuple[GrpcServer, FakeController]]:
    server, impl = await serve_fake_controller(key=KEY)
    yield server, impl
    await server.stop(0)


def nm_config(controller_port: int, key_file: str, tmp_path: Path, **over: Any) -> dict[str, Any]:
    """A fast config: short intervals, simulator engines with zero latency."""
    cfg: dict[str, Any] = {
        "job_name": "job-a",
        "role": "prefill",
        "engine_type": "vllm",
        "model_name": "sim-model",
        "ip": "127.0.0.1",
        "controller_address": f"127.0.0.1:{controller_port}",
        "server": {"host": "127.0.0.1", "port": 0, "management_key_file": key_file, "grace_seconds": 0.2},
        "endpoints_per_node": 2,
        "heartbeat_interval_seconds": 0.2,
        "daemon_loop_interval": 0.2,
        "config_watch_interval_sec": 0.2,
        "stop_exit_delay_sec": 0.1,
        "health": {"poll_interval_sec": 0.1, "timeout_sec": 1.0, "port_wait_sec": 10,
                   "startup_grace_sec": 0.0, "abnormal_threshold": 3},
        "engine": {"launcher": "simulator", "env": {"MOTOR_SIM_ZERO_LATENCY": "1"},
                   "stop_timeout_sec": 3.0, "log_dir": str(tmp_path / "engines")},
        "registration": {"max_attempts": 3, "backoff_base_sec": 0.1, "rpc_timeout_sec": 1.0},
        "log": {"format": "text", "level": "INFO"},
    }  # fmt: skip
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k] = {**cfg[k], **v}
        else:
            cfg[k] = v
    return cfg


class Admin:
    """NodeManagerService client with the management key."""

    def __init__(self, address: str, key: str = KEY) -> None:
        self.channel = open_channel(address)
        self.stub = pbg.NodeManagerServiceStub(self.channel)
        self.md = call_metadata(key)

    async def call(self, method: str, request: Any, timeout: float = 20.0) -> Any:
        return await getattr(self.stub, method)(request, metadata=self.md, timeout=timeout)

    async def close(self) -> None:
        await self.channel.close()


def code_of(exc: BaseException) -> grpc.StatusCode | None:
    return exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
