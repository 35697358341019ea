"""End to end on a real fleet: an unhealthy engine (the engine's own ``vllm_fault`` publisher + the
health probe) is awaited and not relaunched when it recovers, and escalated to a relaunch when it does
not; a 2-node instance that loses one nodemanager is restarted whole and comes back under the same id."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.request
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from motor_common.gen.motor.controller.v1 import controller_pb2 as cpb
from tests.fault.fleet import Fleet, Load, fleet
from tests.fault.test_engine_relaunch_e2e import Watch
from tests.helpers import free_port, wait_for

pytestmark = pytest.mark.slow



def sim_fault(port: int, mode: str) -> None:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/sim/fault", data=f'{{"mode": "{mode}"}}'.encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    urllib.request.urlopen(req, timeout=2).read()


async def unhealthy_fleet_node(f: Fleet) -> tuple[cpb.ManagedInstance, int, int]:
    ft = {"zmq_pub_port": free_port(), "zmq_retry_interval_sec": 0.5}
    await f.add_node("p0", "job-p0", "prefill", fault_tolerance_config=ft)
    await wait_for(lambda: f.active("job-p0"), timeout=20, what="job-p0 ACTIVE")
    await wait_for(lambda: "fault reporter subscribed" in f.nodes["p0"].proc.log_text(), timeout=20, what="ZMQ SUB")
    mi = await f.live_instance("job-p0")
    assert mi is not None
    st = await f.nm_status("p0")
    return mi, mi.instance.endpoints[0].business_port, int(st.endpoints[0].pid)


_STATE_OF = {
    "await_recovery": cpb.FAULT_TOLERANCE_STATE_AWAITING_RECOVERY,
    "engine_relaunch": cpb.FAULT_TOLERANCE_STATE_RELAUNCHING,
    "node_restart": cpb.FAULT_TOLERANCE_STATE_RESTARTING_NODES,
}


async def recovering_with(f: Fleet, iid: int, strategy: str) -> bool:
    ft = await f.ft_status(iid)
    return ft.strategy == strategy and ft.state == _STATE_OF[strategy]


async def test_unhealthy_engine_that_recovers_by_itself_is_not_relaunched(tmp_path: Path) -> None:
    async with fleet(tmp_path, await_recovery_timeout_sec=15.0, await_recovery_stable_sec=0.5) as f:
        mi, port, pid = await unhealthy_fleet_node(f)
        watch = Watch(f, mi.instance.id)
        watch_task = asyncio.get_running_loop().create_task(watch.run())
        try:
            t0 = time.monotonic()
            sim_fault(port, "health_503")  # publisher: unhealthy; /health: 503 — process alive
            await wait_for(lambda: recovering_with(f, mi.instance.id, "await_recovery"), timeout=20,
                           what="await_recovery running")  # fmt: skip
            t_rec = time.monotonic()
            await asyncio.sleep(1.0)  # stays unhealthy a while (shorter than the await deadline)
            sim_fault(port, "none")
            await wait_for(lambda: f.active("job-p0"), timeout=10, what="job-p0 ACTIVE again")
            t_back = time.monotonic()
            again = await f.live_instance("job-p0")
            assert again is not None and again.instance.id == mi.instance.id
            st = await f.nm_status("p0")
            assert st.relaunch_count == 0 and int(st.endpoints[0].pid) == pid and not st.frozen
            log = f.nodes["p0"].proc.log_text()
            assert "[ENGINE RELAUNCH" not in log and "engine-publisher fault reported" in log
            ft = await f.ft_status(mi.instance.id)
            assert ft.strategy == "await_recovery" and ft.state == cpb.FAULT_TOLERANCE_STATE_IDLE
            assert cpb.INSTANCE_STATE_RECOVERING in watch.states and f.nodes["p0"].restarts == 0
            print(f"\n[unhealthy-recovers e2e] fault -> RECOVERING {t_rec - t0:.2f}s; fault cleared after 1.0s;"
                  f" fault -> ACTIVE again {t_back - t0:.2f}s, no relaunch; states {watch.states}")
        finally:
            watch_task.cancel()
            await asyncio.gather(watch_task, return_exceptions=True)


async def test_unhealthy_engine_that_does_not_recover_escalates_to_a_relaunch(tmp_path: Path) -> None:
    async with fleet(tmp_path, await_recovery_timeout_sec=2.0, await_recovery_stable_sec=0.5) as f:
        mi, port, pid = await unhealthy_fleet_node(f)
        t0 = time.monotonic()
        sim_fault(port, "health_503")
        await wait_for(lambda: recovering_with(f, mi.instance.id, "await_recovery"), timeout=20, what="await_recovery")
        await wait_for(lambda: recovering_with(f, mi.instance.id, "engine_relaunch"), timeout=10, what="escalation")
        t_esc = time.monotonic()
        await wait_for(lambda: f.active("job-p0"), timeout=15, what="job-p0 ACTIVE after the relaunch")
        t_back = time.monotonic()
        again = await f.live_instance("job-p0")
        assert again is not None and again.instance.id == mi.instance.id
        st = await f.nm_status("p0")
        assert st.relaunch_count == 1 and int(st.endpoints[0].pid) != pid
        assert "[ENGINE RELAUNCH #1]" in f.nodes["p0"].proc.log_text() and f.nodes["p0"].restarts == 0
        ft = await f.ft_status(mi.instance.id)
        assert ft.strategy == "engine_relaunch" and ft.state == cpb.FAULT_TOLERANCE_STATE_IDLE
        print(f"\n[unhealthy-no-recovery e2e] fault -> escalated to relaunch {t_esc - t0:.2f}s (await deadline 2s);"
              f" fault -> ACTIVE again {t_back - t0:.2f}s")


def kill_node(f: Fleet, name: str) -> None:
    """Lose a node: SIGKILL its nodemanager and its engine process groups."""
    proc = psutil.Process(f.nodes[name].proc.proc.pid)
    children = proc.children(recursive=True)
    proc.kill()
    for c in children:
        try:
            os.killpg(c.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


async def test_partial_node_loss_restarts_the_survivor_and_the_instance_comes_back_with_the_same_id(
    tmp_path: Path,
) -> None:
    async with fleet(tmp_path) as f:
        two = {"nodes_per_instance": 2, "restart_any_exit_after": 2.0}
        await f.add_node("m0", "job-m", "prefill", node_rank=0, **two)
        await f.add_node("m1", "job-m", "prefill", node_rank=1, **two)
        await f.add_node("d0", "job-d0", "decode")
        await wait_for(lambda: f.active("job-m", "job-d0"), timeout=25, what="2-node P and D ACTIVE")
        mi = await f.live_instance("job-m")
        assert mi is not None and len(mi.node_ids) == 2 and len(mi.instance.endpoints) == 2
        survivor_pid = f.nodes["m0"].proc.proc.pid
        load = Load(f.gateway.url + "/v1", workers=2)
        load_task = asyncio.get_running_loop().create_task(load.run())
        try:
            await wait_for(lambda: sum(ok for _, ok in load.results) >= 5, timeout=10, what="requests served")
            t_kill = time.monotonic()
            kill_node(f, "m1")
            # the controller stops the survivor (StopNode → exit 75), the supervisor restarts both
            await wait_for(lambda: EXIT_75 in f.nodes["m0"].exit_codes, timeout=15, what="survivor stopped (75)")
            t_stop = time.monotonic()
            await wait_for(lambda: f.nodes["m0"].restarts >= 1, timeout=20, what="survivor restarted")
            assert f.nodes["m0"].proc.proc.pid != survivor_pid
            await wait_for(lambda: f.nodes["m1"].restarts >= 1, timeout=10, what="lost node rescheduled")
            await wait_for(lambda: f.active("job-m"), timeout=25, what="job-m ACTIVE again")
            t_back = time.monotonic()
            again = await f.live_instance("job-m")
            assert again is not None and again.instance.id == mi.instance.id  # stable node ids: rejoined
            assert tuple(again.node_ids) == tuple(mi.node_ids)
            await wait_for(lambda: load.first_ok_after(t_back) is not None, timeout=10, what="requests after")
            t_ok = load.first_ok_after(t_back)
            assert t_ok is not None
            log = f.controller.log()
            assert "restarting nodes" in log
            print(f"\n[partial-loss e2e] kill m1 -> survivor m0 exited 75 {t_stop - t_kill:.2f}s; kill -> job-m"
                  f" ACTIVE again (same id, m1 rescheduled after 2s) {t_back - t_kill:.2f}s;"
                  f" {load.failures_after(t_kill)} failed / {sum(ok for ts, ok in load.results if ts > t_kill)} ok"
                  " requests after the kill")
        finally:
            load_task.cancel()
            await asyncio.gather(load_task, return_exceptions=True)


EXIT_75 = 75
