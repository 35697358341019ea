"""`motor pause` / `motor resume` in a managed fleet: the instance turns PAUSED at the coordinator
(through its nodes and the controller's push) and back; the coordinator itself refuses an
operator's untracked PauseInstances because it is managed (FAILED_PRECONDITION)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import grpc
import pytest

from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_client import call_metadata, open_channel
from motor_common.grpc_server import error_reason
from tests.conftest import tool
from tests.helpers import wait_for
from tests.motor_up import UpFleet, motor_up

pytestmark = pytest.mark.slow


async def statuses(fleet: UpFleet) -> dict[int, str]:
    key = Path(fleet.info["management_key_file"]).read_text().strip()
    async with open_channel(fleet.info["coordinators"][0]) as ch:
        resp = await cgrpc.InstanceRegistryServiceStub(ch).ListInstances(
            cpb.ListInstancesRequest(), metadata=call_metadata(key), timeout=5)
    return {i.id: tpb.InstanceStatus.Name(i.status) for i in resp.instances}


async def motor(fleet: UpFleet, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, [tool("motor"), *args, "--state-dir", str(fleet.state)],
        capture_output=True, text=True, timeout=30)


async def test_pause_and_resume_through_the_fleet(tmp_path: Path) -> None:
    async with motor_up(tmp_path, "--prefill", "1", "--decode", "1", "--zero-latency") as fleet:
        before = await statuses(fleet)
        assert set(before.values()) == {"INSTANCE_STATUS_AVAILABLE"}
        iid = min(before)

        paused = await motor(fleet, "pause", str(iid), "--json")
        assert paused.returncode == 0, paused.stderr
        assert json.loads(paused.stdout)["state"] == "paused"

        async def is_(status: str) -> bool:
            return (await statuses(fleet))[iid] == status

        await wait_for(lambda: is_("INSTANCE_STATUS_PAUSED"), timeout=20, what="instance paused at the coordinator")
        other = max(before)
        assert (await statuses(fleet))[other] == "INSTANCE_STATUS_AVAILABLE"

        # The coordinator is managed: a direct untracked pause is refused and changes nothing.
        key = Path(fleet.info["management_key_file"]).read_text().strip()
        async with open_channel(fleet.info["coordinators"][0]) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await cgrpc.InstanceRegistryServiceStub(ch).PauseInstances(
                    cpb.PauseInstancesRequest(instance_ids=[other]), metadata=call_metadata(key), timeout=5)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_reason(err.value) == "MANAGED_BY_CONTROLLER"
        assert (await statuses(fleet))[other] == "INSTANCE_STATUS_AVAILABLE"

        resumed = await motor(fleet, "resume", str(iid))
        assert resumed.returncode == 0 and "resumed" in resumed.stdout, resumed.stderr
        await wait_for(lambda: is_("INSTANCE_STATUS_AVAILABLE"), timeout=20, what="instance resumed")

        unknown = await motor(fleet, "pause", "12345")
        assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr
