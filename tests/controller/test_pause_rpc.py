"""ControllerAdminService/PauseInstance and ResumeInstance on a real motor-controller with a real
motor-nodemanager (simulated engine), called with grpcurl through reflection (no .proto at hand):
the pause is recorded with its reason, idempotent, refused with the right status for bad input
(nothing changes), and a resume names the nodes whose nodemanager holds a pause of its own."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import tool
from tests.helpers import wait_for
from tests.procs import start_controller, start_nodemanager

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
KEY = "pause-rpc-test-key"
ADMIN = "motor.controller.v1.ControllerAdminService"
CONFIG = {"heartbeat_interval_sec": 0.2, "heartbeat_timeout_sec": 3.0, "reconcile_interval_sec": 0.2}


async def grpcurl(address: str, method: str, body: dict[str, Any] | None = None,
                  key: str | None = KEY) -> subprocess.CompletedProcess[str]:
    args = [tool("grpcurl"), "-plaintext"]
    if key:
        args += ["-H", f"x-motor-management-key: {key}"]
    if body is not None:
        args += ["-d", json.dumps(body)]
    return await asyncio.to_thread(subprocess.run, [*args, address, method], capture_output=True, text=True,
                                   timeout=20)


async def call(address: str, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    out = await grpcurl(address, method, body)
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


async def test_pause_and_resume_instance_through_grpcurl(tmp_path: Path) -> None:
    async with start_controller(tmp_path, CONFIG, management_key=KEY) as ctl:
        nm = await start_nodemanager(tmp_path, {
            "job_name": "pause-rpc", "role": "decode", "controller_address": ctl.address,
            "heartbeat_interval_seconds": 0.2,
            "server": {"host": "127.0.0.1", "port": 0, "management_key_file": str(tmp_path / "controller.key")},
            "engine": {"launcher": "simulator", "extra_args": ["--sim-zero-latency"]},
        })
        try:
            # describe documents the call from the served descriptors (comments included)
            described = await asyncio.to_thread(subprocess.run, [tool("grpcurl"), "-plaintext", ctl.address,
                                                                 "describe", f"{ADMIN}.PauseInstance"],
                                                capture_output=True, text=True, timeout=20)
            assert described.returncode == 0 and "survives a restart" in described.stdout, described.stderr

            async def active() -> str | None:
                got = await call(ctl.address, f"{ADMIN}/ListInstances")
                ready = [i for i in got.get("instances", []) if i["state"] == "INSTANCE_STATE_ACTIVE"]
                return ready[0]["instance"]["id"] if ready else None

            iid = await wait_for(active, timeout=60, what="instance ACTIVE")
            paused = await call(ctl.address, f"{ADMIN}/PauseInstance", {"instance_id": iid, "reason": "drain rack 4"})
            inst = paused["instance"]
            assert (inst["paused"], inst["pauseReason"], inst["state"]) == (True, "drain rack 4", "INSTANCE_STATE_ACTIVE")
            assert inst["pausedAt"]
            again = await call(ctl.address, f"{ADMIN}/PauseInstance", {"instance_id": iid, "reason": "other"})
            assert again["instance"]["pauseReason"] == "drain rack 4"  # idempotent: nothing changed

            # bad input: the right status, a message to act on, and the instance unchanged
            for body, code, words in (
                ({"instance_id": "0"}, "InvalidArgument", "exactly one of instance_id and node_id"),
                ({"instance_id": iid, "node_id": "n"}, "InvalidArgument", "exactly one of instance_id and node_id"),
                ({"node_id": "no-such-node"}, "NotFound", "serves no live instance"),
                ({"instance_id": str(2**53)}, "InvalidArgument", f"outside [1, {2**53 - 1}]"),
                ({"instance_id": "12345"}, "NotFound", "instance 12345 is not known"),
                ({"instance_id": iid, "reason": "x" * 257}, "InvalidArgument", "at most 256"),
                ({"instance_id": iid, "reason": "a\nb"}, "InvalidArgument", "one line"),
            ):
                for method in ("PauseInstance", "ResumeInstance"):
                    if "reason" in body and method == "ResumeInstance":
                        continue
                    bad = await grpcurl(ctl.address, f"{ADMIN}/{method}", body)
                    assert bad.returncode != 0 and f"Code: {code}" in bad.stderr and words in bad.stderr, bad.stderr
            denied = await grpcurl(ctl.address, f"{ADMIN}/ResumeInstance", {"instance_id": iid}, key=None)
            assert denied.returncode != 0 and "Unauthenticated" in denied.stderr
            got = (await call(ctl.address, f"{ADMIN}/GetInstance", {"instance_id": iid}))["instance"]
            assert (got["paused"], got["pauseReason"]) == (True, "drain rack 4")

            # the nodemanager pauses itself too (a pre-stop drain): resume says the instance stays paused
            await call(nm.address, "motor.nodemanager.v1.NodeManagerService/PauseNode", {})

            async def node_paused() -> bool:
                nodes = (await call(ctl.address, f"{ADMIN}/ListNodes")).get("nodes", [])
                return [n["state"] for n in nodes] == ["NODE_STATE_PAUSED"]

            await wait_for(node_paused, timeout=20, what="the node's own pause seen by the controller")
            resumed = await call(ctl.address, f"{ADMIN}/ResumeInstance", {"instance_id": iid})
            assert "paused" not in resumed["instance"] and "pauseReason" not in resumed["instance"]
            node_id = (await call(ctl.address, f"{ADMIN}/ListNodes"))["nodes"][0]["spec"]["nodeId"]
            assert resumed["pausedNodeIds"] == [node_id]
            await call(nm.address, "motor.nodemanager.v1.NodeManagerService/ResumeNode", {})

            async def node_running() -> bool:
                nodes = (await call(ctl.address, f"{ADMIN}/ListNodes")).get("nodes", [])
                return [n["state"] for n in nodes] == ["NODE_STATE_RUNNING"]

            await wait_for(node_running, timeout=20, what="the node resumed")
            again = await call(ctl.address, f"{ADMIN}/ResumeInstance", {"instance_id": iid})
            assert "paused" not in again["instance"] and "pausedNodeIds" not in again

            # by node: the instance the node serves
            by_node = await call(ctl.address, f"{ADMIN}/PauseInstance", {"node_id": node_id, "reason": "rack"})
            assert (by_node["instance"]["instance"]["id"], by_node["instance"]["pauseReason"]) == (iid, "rack")
            back = await call(ctl.address, f"{ADMIN}/ResumeInstance", {"node_id": node_id})
            assert back["instance"]["instance"]["id"] == iid and "paused" not in back["instance"]
        finally:
            nm.terminate()
