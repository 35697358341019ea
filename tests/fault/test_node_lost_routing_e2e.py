"""End to end on a real fleet (controller, coordinator, gateway, nodemanagers, motor-sim engines): a
SIGKILLed nodemanager (its engine survives: its own session, adopted on restart) must not take its
serving engine out of routing. The controller marks the instance INACTIVE (node lost) but keeps it in
the coordinators' routing for ``node_lost_routing_grace_sec``; requests keep reaching the engine and
none fails; the restarted nodemanager adopts the engine and the instance is ACTIVE again under the
same id, never out of routing meanwhile. The control: with the grace 0 the coordinator drops the instance at once."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.controller.v1 import controller_pb2 as cpb
from tests.fault.fleet import Fleet, Load, fleet
from tests.fault.test_engine_relaunch_e2e import Watch, finished
from tests.helpers import wait_for

pytestmark = pytest.mark.slow


async def pd_pair(f: Fleet) -> tuple[int, int, int]:
    """One prefill (p0) and one decode (d0), both AVAILABLE on the coordinator; returns p0's
    instance id, its engine's port and pid."""
    await f.add_node("p0", "job-p0", "prefill")
    await f.add_node("d0", "job-d0", "decode")
    await wait_for(lambda: f.active("job-p0", "job-d0"), timeout=25, what="P and D ACTIVE")
    mi = await f.live_instance("job-p0")
    assert mi is not None
    iid = mi.instance.id
    await wait_for(lambda: available(f, iid), timeout=10, what="p0 AVAILABLE on the coordinator")
    st = await f.nm_status("p0")
    return iid, mi.instance.endpoints[0].business_port, int(st.endpoints[0].pid)


async def available(f: Fleet, iid: int) -> bool:
    return (await f.coordinator_view()).get(iid) == tpb.INSTANCE_STATUS_AVAILABLE


async def dropped(f: Fleet, iid: int) -> bool:
    return iid not in await f.coordinator_view()


async def node_lost(f: Fleet, job: str) -> bool:
    mi = await f.live_instance(job)
    return mi is not None and mi.state == cpb.INSTANCE_STATE_INACTIVE and "heartbeat" in mi.reason


async def kill_p0_nodemanager_under(f: Fleet, load: Load) -> float:
    """Once *load* is served, SIGKILL p0's nodemanager and wait for its instance INACTIVE (node
    lost); the time of the kill."""
    await wait_for(lambda: sum(ok for _, ok in load.results) >= 5, timeout=10, what="requests served")
    t_kill = time.monotonic()
    await kill_nodemanager(f, "p0")
    await wait_for(lambda: node_lost(f, "job-p0"), timeout=10, what="p0's instance INACTIVE (node lost)")
    return t_kill


async def kill_nodemanager(f: Fleet, name: str) -> None:
    """SIGKILL the nodemanager process only (its engines run in their own sessions and live on)."""
    proc = f.nodes[name].proc.proc
    os.kill(proc.pid, signal.SIGKILL)
    await wait_for(lambda: proc.poll() is not None, timeout=10, what=f"nodemanager {name} killed")


async def test_a_killed_nodemanager_leaves_its_engine_in_routing_serving_and_its_instance_rejoins(
    tmp_path: Path,
) -> None:
    async with fleet(tmp_path) as f:  # node_lost_routing_grace_sec: the default (300 s)
        iid, port, engine_pid = await pd_pair(f)
        load = Load(f.gateway.url + "/v1", workers=2)
        load_task = asyncio.get_running_loop().create_task(load.run())
        watch = Watch(f, iid)  # what the controller and the coordinator show of p0's instance, throughout
        watch_task = asyncio.get_running_loop().create_task(watch.run())
        try:
            t_kill = await kill_p0_nodemanager_under(f, load)
            t_lost = time.monotonic()
            assert psutil.pid_exists(engine_pid)
            assert await available(f, iid), "the coordinator dropped the instance of the lost node"
            served = finished(port)
            # the engine of the lost node keeps receiving requests through the gateway
            await wait_for(lambda: finished(port) >= served + 10, timeout=10, what="p0's engine serving")
            assert await available(f, iid)
            assert "kept in routing with its node" in f.controller.log()
            failed_down = load.failures_after(t_kill)
            ok_down = sum(ok for ts, ok in load.results if ts > t_kill)
            assert failed_down == 0, load.errors[-5:]
            assert cpb.INSTANCE_STATE_INACTIVE in watch.states
            assert watch.coordinator == [tpb.INSTANCE_STATUS_AVAILABLE]  # never dropped, never paused

            f.nodes["p0"].restart_any_exit_after = 0.0  # the supervisor brings the nodemanager back
            await wait_for(lambda: f.active("job-p0"), timeout=30, what="job-p0 ACTIVE again")
            t_back = time.monotonic()
            again = await f.live_instance("job-p0")
            assert again is not None and again.instance.id == iid  # the same instance, not re-assembled
            st = await f.nm_status("p0")
            assert [int(e.pid) for e in st.endpoints] == [engine_pid]  # adopted, not relaunched
            await wait_for(lambda: available(f, iid), timeout=10, what="p0 AVAILABLE again")
            served = finished(port)
            await wait_for(lambda: finished(port) >= served + 5, timeout=10, what="p0's engine serving after")
            print(f"\n[node-lost routing e2e] kill -9 p0's nodemanager -> INACTIVE {t_lost - t_kill:.2f}s, kept"
                  f" AVAILABLE; {failed_down} failed / {ok_down} ok requests while it was down;"
                  f" kill -> ACTIVE again (same id, engine adopted) {t_back - t_kill:.2f}s;"
                  f" {load.failures_after(t_kill)} failed / {sum(ok for ts, ok in load.results if ts > t_kill)} ok"
                  f" requests after the kill in all; coordinator statuses seen {watch.coordinator}")
            assert load.failures_after(t_kill) == 0, load.errors[-5:]
            # nor while the restarted nodemanager waited for the start command that adopted the engine
            assert watch.coordinator == [tpb.INSTANCE_STATUS_AVAILABLE]
        finally:
            load_task.cancel()
            watch_task.cancel()
            await asyncio.gather(load_task, watch_task, return_exceptions=True)
            if psutil.pid_exists(engine_pid) and f.nodes["p0"].proc.proc.poll() is not None:
                os.killpg(engine_pid, signal.SIGKILL)  # a failed test must not leave the engine behind


async def test_with_the_grace_off_a_killed_nodemanager_takes_its_instance_out_of_routing(tmp_path: Path) -> None:
    async with fleet(tmp_path, controller_extra={"node_lost_routing_grace_sec": 0}) as f:
        iid, port, engine_pid = await pd_pair(f)
        load = Load(f.gateway.url + "/v1", workers=2)
        load_task = asyncio.get_running_loop().create_task(load.run())
        try:
            t_kill = await kill_p0_nodemanager_under(f, load)
            await wait_for(lambda: dropped(f, iid), timeout=5, what="the coordinator drops p0's instance")
            assert psutil.pid_exists(engine_pid)  # it could still serve, but is out of routing
            served, seen = finished(port), len(load.results)
            await wait_for(lambda: len(load.results) >= seen + 10, timeout=20, what="more requests through the gateway")
            assert finished(port) <= served + load.workers  # at most those already under way reached it
            assert "kept in routing" not in f.controller.log()
            print(f"\n[node-lost routing e2e, grace 0] kill -9 p0's nodemanager: instance dropped from routing;"
                  f" {load.failures_after(t_kill)} failed / {sum(ok for ts, ok in load.results if ts > t_kill)} ok"
                  " requests after the kill")
        finally:
            load_task.cancel()
            await asyncio.gather(load_task, return_exceptions=True)
            if psutil.pid_exists(engine_pid):
                os.killpg(engine_pid, signal.SIGKILL)
