"""Every gRPC program answers `grpcurl list` and `Health/Check` with no .proto files at hand, and its
admin API works through grpcurl with the management key (and refuses without it)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import tool
from tests.procs import start_controller, start_coordinator, start_nodemanager

pytestmark = pytest.mark.slow
KEY = "grpcurl-test-key"


async def grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, [tool("grpcurl"), "-plaintext", *args], capture_output=True, text=True, timeout=20
    )


async def health(address: str, service: str = "") -> str:
    out = await grpcurl("-d", json.dumps({"service": service}), address, "grpc.health.v1.Health/Check")
    assert out.returncode == 0, out.stderr
    return str(json.loads(out.stdout)["status"])


async def assert_lists_and_serves(address: str, services: set[str], overall: str = "SERVING") -> None:
    listed = await grpcurl(address, "list")
    assert listed.returncode == 0, listed.stderr
    names = set(listed.stdout.split())
    assert services | {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                           "grpc.reflection.v1.ServerReflection"} <= names
    assert await health(address) == overall


async def test_controller_coordinator_and_nodemanager_answer_grpcurl(tmp_path: Path) -> None:
    async with start_controller(tmp_path, management_key=KEY) as ctl, \
            start_coordinator(tmp_path, management_key=KEY) as coord:  # fmt: skip
        await assert_lists_and_serves(ctl.address, {"motor.controller.v1.ControllerService",
                                                    "motor.controller.v1.ControllerAdminService"})
        # A coordinator with no instances is alive but not ready: overall NOT_SERVING, while its
        # registry keeps SERVING so it can be fed instances.
        await assert_lists_and_serves(coord.address, {"motor.coordinator.v1.InstanceRegistryService",
                                                      "motor.coordinator.v1.DispatchService"}, "NOT_SERVING")
        assert await health(coord.address, "motor.coordinator.v1.InstanceRegistryService") == "SERVING"
        nm = await start_nodemanager(tmp_path, {
            "job_name": "grpcurl", "role": "prefill", "controller_address": ctl.address,
            "server": {"host": "127.0.0.1", "port": 0, "management_key_file": str(tmp_path / "controller.key")},
            "engine": {"launcher": "simulator"},
        })
        try:
            nm_address = f"127.0.0.1:{nm.port}"
            listed = await grpcurl(nm_address, "list")
            assert {"motor.nodemanager.v1.NodeManagerService", "motor.nodemanager.v1.ScaleDownService"} <= set(
                listed.stdout.split()), listed.stderr
            # Admin calls through grpcurl: refused without the key, answered with it.
            denied = await grpcurl(ctl.address, "motor.controller.v1.ControllerAdminService/ListNodes")
            assert denied.returncode != 0 and "Unauthenticated" in denied.stderr
            nodes = await grpcurl("-H", f"x-motor-management-key: {KEY}", ctl.address,
                                  "motor.controller.v1.ControllerAdminService/ListNodes")
            assert nodes.returncode == 0, nodes.stderr
            status = await grpcurl("-H", f"x-motor-management-key: {KEY}", nm_address,
                                   "motor.nodemanager.v1.NodeManagerService/GetStatus")
            # The controller starts the node's engine at once, so it may already be past REGISTERED.
            live = {"NODE_STATE_REGISTERED", "NODE_STATE_STARTING", "NODE_STATE_RUNNING"}
            assert status.returncode == 0 and json.loads(status.stdout)["state"] in live, status.stdout
            bad = await grpcurl("-H", f"x-motor-management-key: {KEY}", "-d", '{"instance_id": "1", "bogus": 1}',
                                coord.address, "motor.coordinator.v1.InstanceRegistryService/GetInstance")
            assert bad.returncode != 0 and "bogus" in bad.stderr  # unknown JSON field: refused, nothing sent
        finally:
            nm.terminate()
