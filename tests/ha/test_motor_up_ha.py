"""`motor up --ha` end to end: a local etcd, two coordinators active/standby, the controller on
the etcd store, the gateway knowing both. A request through the `openai` SDK works; the master
coordinator is frozen (SIGSTOP): requests succeed again within 5 s; SIGCONT: it is a standby.

Run: ``.venv/bin/pytest tests/ha/test_motor_up_ha.py -s`` (prints the measurement).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import openai
import pytest

from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_client import open_channel
from tests.helpers import wait_for
from tests.motor_up import UpFleet, motor_up

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.timeout(120)]


class HaFleet(UpFleet):
    def coordinator_pids(self) -> dict[str, int]:
        """gRPC address -> pid of each coordinator."""
        progs = self.info["programs"]
        return {
            f"127.0.0.1:{p['port']}": int(p["pid"])
            for p in progs.values()
            if p["kind"] == "coordinator"
        }

    async def role(self, address: str) -> tuple[int, bool] | None:
        async with open_channel(address) as ch:
            try:
                r: cpb.GetReadinessResponse = await cgrpc.DispatchServiceStub(ch).GetReadiness(
                    cpb.GetReadinessRequest(), timeout=0.3
                )
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
    async with motor_up(tmp_path, "--ha", "--zero-latency", timeout=60) as up:
        yield HaFleet(up.state, up.proc, up.log)


async def test_motor_up_ha_fails_over_a_frozen_master_coordinator_within_5s(fleet: HaFleet) -> None:
    assert len(fleet.coordinator_pids()) == 2 and "etcd" in fleet.log.read_text()
    client = openai.AsyncOpenAI(
        base_url=fleet.info["gateway_url"] + "/v1", api_key="unused", max_retries=0, timeout=3
    )
    try:
        resp = await client.completions.create(model="tiny", prompt="Hello, Motor", max_tokens=8)
        assert resp.choices[0].text
        master = await wait_for(fleet.master, timeout=10, what="a ready master coordinator")
        pid = fleet.coordinator_pids()[master]

        os.kill(pid, signal.SIGSTOP)
        frozen = time.monotonic()

        async def request_ok() -> bool:
            r = await client.completions.create(
                model="tiny", prompt="after the freeze", max_tokens=4
            )
            return bool(r.choices[0].text)

        await wait_for(
            request_ok, timeout=5, interval=0.05, what="a request to succeed after the freeze"
        )
        took = time.monotonic() - frozen
        print(
            f"\n[motor up --ha] SIGSTOP master coordinator -> requests succeed again after {took:.2f}s"
        )
        assert took < 5.0

        os.kill(pid, signal.SIGCONT)
        await wait_for(
            lambda: _standby(fleet, master), timeout=10, what="the old master back as standby"
        )
        assert await request_ok()
    finally:
        await client.close()


async def _standby(fleet: HaFleet, address: str) -> bool:
    view = await fleet.role(address)
    return view is not None and view[0] == cpb.COORDINATOR_ROLE_STANDBY
