"""`motor up --ha` end to end: a local etcd, two coordinators active/standby, the controller on
the etcd store, the gateway knowing both. A request through the `openai` SDK works; the master
coordinator is frozen (SIGSTOP): requests succeed again within 5 s; SIGCONT: it is a standby.

Run: ``.venv/bin/pytest tests/ha/test_motor_up_ha.py -s`` (prints the measurement).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest

from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_client import open_channel
from tests.conftest import tool
from tests.helpers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.timeout(120)]


class HaFleet:
    def __init__(self, state: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.state, self.proc, self.log = state, proc, log

    @property
    def info(self) -> dict[str, Any]:
        return dict(json.loads((self.state / "fleet.json").read_text()))

    def coordinator_pids(self) -> dict[str, int]:
        """gRPC address -> pid of each coordinator."""
        progs = self.info["programs"]
        return {f"127.0.0.1:{p['port']}": int(p["pid"]) for p in progs.values() if p["kind"] == "coordinator"}

    async def role(self, address: str) -> tuple[int, bool] | None:
        async with open_channel(address) as ch:
            try:
                r: cpb.GetReadinessResponse = await cgrpc.DispatchServiceStub(ch).GetReadiness(
                    cpb.GetReadinessRequest(), timeout=0.3)
            except grpc.aio.AioRpcError:
                return None
        return r.role, r.ready

    async def master(self) -> str:
        for addr in self.coordinator_pids():
            if await self.role(addr) == (cpb.COORDINATOR_ROLE_MASTER, True):
                return addr
        return ""


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[HaFleet]:
    state = tmp_path / "up"
    log = tmp_path / "motor-up.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [tool("motor"), "up", "--ha", "--port", "0", "--state-dir", str(state), "--zero-latency"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    f = HaFleet(state, proc, log)

    def ready() -> bool:
        assert proc.poll() is None, log.read_text()
        return bool(f.info.get("ready"))

    try:
        await wait_for(ready, timeout=60, what="motor up --ha ready")
        yield f
    finally:
        for pid in f.coordinator_pids().values() if (state / "fleet.json").exists() else ():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # clean stop: every child (etcd included) goes with it
            try:
                await asyncio.to_thread(proc.wait, 20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


async def test_motor_up_ha_fails_over_a_frozen_master_coordinator_within_5s(fleet: HaFleet) -> None:
    assert len(fleet.coordinator_pids()) == 2 and "etcd" in fleet.log.read_text()
    client = openai.AsyncOpenAI(base_url=fleet.info["gateway_url"] + "/v1", api_key="unused", max_retries=0, timeout=3)
    try:
        resp = await client.completions.create(model="tiny", prompt="Hello, Motor", max_tokens=8)
        assert resp.choices[0].text
        master = await wait_for(fleet.master, timeout=10, what="a ready master coordinator")
        pid = fleet.coordinator_pids()[master]

        os.kill(pid, signal.SIGSTOP)
        frozen = time.monotonic()

        async def request_ok() -> bool:
            r = await client.completions.create(model="tiny", prompt="after the freeze", max_tokens=4)
            return bool(r.choices[0].text)

        await wait_for(request_ok, timeout=5, interval=0.05, what="a request to succeed after the freeze")
        took = time.monotonic() - frozen
        print(f"\n[motor up --ha] SIGSTOP master coordinator -> requests succeed again after {took:.2f}s")
        assert took < 5.0

        os.kill(pid, signal.SIGCONT)
        await wait_for(lambda: _standby(fleet, master), timeout=10, what="the old master back as standby")
        assert await request_ok()
    finally:
        await client.close()


async def _standby(fleet: HaFleet, address: str) -> bool:
    view = await fleet.role(address)
    return view is not None and view[0] == cpb.COORDINATOR_ROLE_STANDBY
