"""A managed fleet with separate credentials, as real processes: controller, coordinator, one
nodemanager (a simulated engine), and a gateway.

Keys (named, YAML ``name: key`` files):
- operators: ``alice`` (a person) and ``controller`` (the controller drives coordinator and nodes);
  the nodemanager's file holds only their SHA-256 digests (it sits beside the engines);
- nodes: ``fleet-nodes`` (nodemanager → controller, coordinator alarms → controller);
- inference: ``app-a``, ``app-b`` (clients) and ``gateway`` (the gateway's own credential to the
  coordinator's DispatchService); the gateway accepts ``app-a``/``app-b`` from HTTP clients.

The fleet reaching an ACTIVE instance that serves a completion proves every hop presents the
right kind of key.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest_asyncio
import yaml

from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as pbg
from motor_common.grpc_client import call_metadata, open_channel
from tests.helpers import wait_for
from tests.procs import (
    NodeManagerProc,
    Proc,
    start_controller,
    start_coordinator,
    start_gateway,
    start_nodemanager,
)

KEYS = {
    "alice": "op-alice-0123456789",
    "controller": "op-controller-0123456789",
    "fleet-nodes": "node-0123456789abcdef",
    "app-a": "inf-app-a-0123456789",
    "app-b": "inf-app-b-0123456789",
    "gateway": "inf-gateway-0123456789",
}


@dataclass
class SecuredFleet:
    dir: Path
    controller: Proc
    coordinator: Proc
    nodemanager: NodeManagerProc
    gateway: Proc
    files: dict[str, Path] = field(default_factory=dict)

    def address(self, program: str) -> str:
        return {"controller": self.controller.address, "coordinator": self.coordinator.address,
                "nodemanager": self.nodemanager.address}[program]

    def log(self, program: str) -> str:
        path = {"controller": self.controller.log_path, "coordinator": self.coordinator.log_path,
                "nodemanager": self.nodemanager.log_path, "gateway": self.gateway.log_path}[program]
        return Path(path).read_text(errors="replace")


def digest(key: str) -> str:
    """A key file entry that accepts *key* without holding it (``printf %s KEY | sha256sum``)."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def _write(path: Path, data: dict[str, str] | str) -> Path:
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def secured(tmp_path_factory: Any) -> AsyncIterator[SecuredFleet]:
    d: Path = tmp_path_factory.mktemp("secured")
    files = {
        "operators": _write(d / "operators.yaml", {"alice": KEYS["alice"], "controller": KEYS["controller"]}),
        # the nodemanager (on the engines' machine) holds only the digests of the keys it accepts
        "nm_operators": _write(d / "nm-operators.yaml", {n: digest(KEYS[n]) for n in ("alice", "controller")}),
        "nodes": _write(d / "nodes.yaml", {"fleet-nodes": KEYS["fleet-nodes"]}),
        "inference": _write(d / "inference.yaml", {n: KEYS[n] for n in ("app-a", "app-b", "gateway")}),
        "api_keys": _write(d / "api-keys.yaml", {n: KEYS[n] for n in ("app-a", "app-b")}),
        "controller_key": _write(d / "controller.key", KEYS["controller"]),
        "node_key": _write(d / "node.key", KEYS["fleet-nodes"]),
        "gateway_key": _write(d / "gateway.key", KEYS["gateway"]),
    }
    operators = str(files["operators"])
    coord_cfg = {"server": {"auth": {"operator_keys_file": operators, "inference_keys_file": str(files["inference"]),
                                     "key_file": str(files["node_key"])}},
                 "http": {"port": 0, "api_key_file": str(files["api_keys"])}}
    async with start_coordinator(d / "coordinator", coord_cfg) as coordinator:
        ctl_cfg = {"server": {"auth": {"operator_keys_file": operators, "node_keys_file": str(files["nodes"]),
                                       "key_file": str(files["controller_key"])}},
                   "coordinators": [coordinator.address], "heartbeat_interval_sec": 0.2,
                   "heartbeat_timeout_sec": 1.5, "reconcile_interval_sec": 0.1}
        async with start_controller(d / "controller", ctl_cfg) as controller:
            nm_cfg = {
                "job_name": "sec", "role": "union", "engine_type": "vllm", "model_name": "tiny",
                "ip": "127.0.0.1", "controller_address": controller.address,
                "server": {"host": "127.0.0.1", "port": 0, "grace_seconds": 0.2,
                           "auth": {"operator_keys_file": str(files["nm_operators"]),
                                    "key_file": str(files["node_key"])}},
                "heartbeat_interval_seconds": 0.2, "daemon_loop_interval": 0.2,
                "health": {"poll_interval_sec": 0.1, "timeout_sec": 1.0, "startup_grace_sec": 0.0},
                "engine": {"launcher": "simulator", "env": {"MOTOR_SIM_ZERO_LATENCY": "1"},
                           "log_dir": str(d / "engines")},
                "registration": {"backoff_base_sec": 0.1, "rpc_timeout_sec": 1.0},
                "log": {"format": "text"},
            }  # fmt: skip
            nm = await start_nodemanager(d, nm_cfg, name="nodemanager")
            try:
                gw_cfg = {"api_key_file": str(files["api_keys"]), "coordinator_key_file": str(files["gateway_key"])}
                async with start_gateway(d / "gateway", [coordinator.address], config=gw_cfg) as gateway:
                    fleet = SecuredFleet(d, controller, coordinator, nm, gateway, files)
                    await wait_for(lambda: _active(controller.address), timeout=60, what="instance ACTIVE")
                    await wait_for(lambda: _serves(gateway.url), timeout=30, what="a completion through the gateway")
                    yield fleet
            finally:
                nm.terminate()


async def _serves(url: str) -> bool:
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 1},
                             headers={"Authorization": f"Bearer {KEYS['app-a']}"},
                             timeout=aiohttp.ClientTimeout(total=5)) as resp:
            return resp.status == 200


async def _active(address: str) -> bool:
    async with open_channel(address) as ch:
        resp = await pbg.ControllerAdminServiceStub(ch).ListInstances(
            pb.ListInstancesRequest(), metadata=call_metadata(KEYS["alice"]), timeout=2)
    return [i.state for i in resp.instances] == [pb.INSTANCE_STATE_ACTIVE]
