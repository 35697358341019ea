"""End to end DP scale-down on a real fleet: a DP=2 union instance (one nodemanager, two motor-sim
engines with the fault-tolerance surface, the ZMQ fault publisher and the emulated DP group); one
rank's engine is SIGKILLed."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.controller.v1 import controller_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as kpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as kgrpc
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as npb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2_grpc as ngrpc
from tests.fault.fleet import Fleet, fleet
from tests.helpers import free_port, wait_for

pytestmark = pytest.mark.slow

JOB = "job-dp"


def sd_config(**over: Any) -> dict[str, Any]:
    return {"enable_dp_scale_down": True,
            "dp_scale_down_config": {"request_timeout_sec": 2.0, "poll_interval_sec": 0.2,
                                     "execution_deadline_sec": 8.0, **over}}  # fmt: skip


async def start_dp2(f: Fleet) -> cpb.ManagedInstance:
    await f.add_node("dp", JOB, "union", endpoints_per_node=2,
                     fault_tolerance_config={"enable_dp_scale_down": True, "zmq_pub_port": free_port(),
                                             "zmq_retry_interval_sec": 0.5})  # fmt: skip
    await wait_for(lambda: f.active(JOB), timeout=20, what="the DP=2 instance ACTIVE")
    mi = await f.live_instance(JOB)
    assert mi is not None and len(mi.instance.endpoints) == 2
    return mi


async def coordinator_endpoints(f: Fleet, iid: int) -> list[int] | None:
    stub = kgrpc.InstanceRegistryServiceStub(f.channel(f.coordinator.address))
    resp = await stub.ListInstances(kpb.ListInstancesRequest(page_size=1000), metadata=f.md, timeout=2)
    for inst in resp.instances:
        if inst.id == iid and inst.status == tpb.INSTANCE_STATUS_AVAILABLE:
            return sorted(e.dp_rank for e in inst.endpoints)
    return None


async def sd_status(f: Fleet) -> npb.GetScaleDownStatusResponse:
    stub = ngrpc.ScaleDownServiceStub(f.channel(f.nodes["dp"].proc.address))
    return await stub.GetScaleDownStatus(npb.GetScaleDownStatusRequest(), metadata=f.md, timeout=2)


async def kill_rank(f: Fleet, rank: int) -> tuple[int, float]:
    st = await f.nm_status("dp")
    pid = int(next(e.pid for e in st.endpoints if e.endpoint_id == rank))
    os.killpg(pid, signal.SIGKILL)
    return pid, time.monotonic()


async def test_killed_rank_is_scaled_down_and_the_instance_serves_on_the_survivor(tmp_path: Path) -> None:
    async with fleet(tmp_path, controller_extra={"dp_master_port": free_port()}, **sd_config()) as f:
        mi = await start_dp2(f)
        iid = mi.instance.id
        assert await wait_for(lambda: coordinator_endpoints(f, iid), timeout=10, what="coordinator view") == [0, 1]
        before = await f.nm_status("dp")
        survivor_pid = next(e.pid for e in before.endpoints if e.endpoint_id == 0)
        _, t_kill = await kill_rank(f, 1)

        async def committed() -> bool:
            st = await f.ft_status(iid)
            return list(st.retired_dp_ranks) == [1] and st.state == cpb.FAULT_TOLERANCE_STATE_IDLE

        await wait_for(committed, timeout=20, what="the scale-down committed")
        t_commit = time.monotonic() - t_kill
        await wait_for(lambda: f.active(JOB), timeout=10, what="the instance ACTIVE again")
        assert await wait_for(lambda: coordinator_endpoints(f, iid), timeout=10,
                              what="coordinator view") == [0]  # fmt: skip
        t_view = time.monotonic() - t_kill
        st = await f.nm_status("dp")
        by_id = {e.endpoint_id: e for e in st.endpoints}
        assert by_id[1].status == tpb.ENDPOINT_STATUS_RETIRED  # reported RETIRED, not omitted
        assert by_id[0].status == tpb.ENDPOINT_STATUS_NORMAL and by_id[0].pid == survivor_pid  # no relaunch
        assert st.relaunch_count == 0
        sd = await sd_status(f)
        assert sd.state == npb.SCALE_DOWN_STATE_IDLE and list(sd.retired_dp_ranks) == [1]
        # heartbeats too: the controller's view of the node shows the rank retired
        mi2 = await f.live_instance(JOB)
        assert mi2 is not None and mi2.instance.id == iid
        client = AsyncOpenAI(base_url=f.gateway.url + "/v1", api_key="unused", max_retries=0, timeout=5.0)
        try:
            r = await client.completions.create(model="sim-model", prompt="after scale-down", max_tokens=4)
            assert r.choices
        finally:
            await client.close()
        print(f"\nDP scale-down: committed {t_commit:.2f}s after the kill, coordinator lists only rank 0 "
              f"{t_view:.2f}s after it; served on the survivor")  # fmt: skip


async def test_survivors_not_healthy_in_time_abort_and_fall_back_to_relaunch(tmp_path: Path) -> None:
    # The simulator reconfigures for 0.3 s after apply; a 0.1 s execution deadline cannot see the
    # survivors HEALTHY again: finalize(abort), the rank is shown again, the engine relaunch takes over.
    cfg = sd_config(execution_deadline_sec=0.1, poll_interval_sec=0.05)
    async with fleet(tmp_path, controller_extra={"dp_master_port": free_port()}, **cfg) as f:
        mi = await start_dp2(f)
        iid = mi.instance.id
        old_pid, t_kill = await kill_rank(f, 1)

        async def relaunched() -> bool:
            st = await f.nm_status("dp")
            return st.relaunch_count >= 1 and all(
                e.status == tpb.ENDPOINT_STATUS_NORMAL and e.pid != old_pid for e in st.endpoints
            )

        await wait_for(relaunched, timeout=25, what="fallback engine relaunch")
        await wait_for(lambda: f.active(JOB), timeout=10, what="ACTIVE after the fallback")
        st = await f.ft_status(iid)
        assert list(st.retired_dp_ranks) == []
        assert (await sd_status(f)).state == npb.SCALE_DOWN_STATE_IDLE
        assert await wait_for(lambda: coordinator_endpoints(f, iid), timeout=10, what="view") == [0, 1]
        print(f"\nDP scale-down abort -> relaunch: ACTIVE again {time.monotonic() - t_kill:.2f}s after the kill")
