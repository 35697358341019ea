"""End to end on a real fleet (controller, coordinator, gateway, nodemanagers, motor-sim engines):
a dead or hung prefill engine is relaunched in place under request load; a relaunch that fails
falls back to restarting the node."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import yaml

from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.controller.v1 import controller_pb2 as cpb
from tests.fault.fleet import Fleet, Load, fleet
from tests.helpers import wait_for

pytestmark = pytest.mark.slow


def sim_state(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/sim/state", timeout=1) as resp:
        state: dict[str, object] = json.loads(resp.read())
    return state


def finished(port: int) -> int:
    stats = sim_state(port)["stats"]
    assert isinstance(stats, dict)
    return int(stats["requests_finished"])


async def start_pd(f: Fleet) -> None:
    await f.add_node("p0", "job-p0", "prefill")
    await f.add_node("p1", "job-p1", "prefill")
    await f.add_node("d0", "job-d0", "decode")
    await wait_for(lambda: f.active("job-p0", "job-p1", "job-d0"), timeout=25, what="3 ACTIVE instances")
    await wait_for(
        lambda: _available(f, 3), timeout=10, what="the coordinator to schedule the 3 instances"
    )


async def _available(f: Fleet, n: int) -> bool:
    view = await f.coordinator_view()
    return sum(1 for s in view.values() if s == tpb.INSTANCE_STATUS_AVAILABLE) >= n


async def engine_pid(f: Fleet, node: str) -> int:
    st = await f.nm_status(node)
    return int(st.endpoints[0].pid)


async def relaunched_and_normal(f: Fleet, node: str, old_pid: int) -> bool:
    st = await f.nm_status(node)
    return bool(st.endpoints) and all(
        e.pid and e.pid != old_pid and e.status == tpb.ENDPOINT_STATUS_NORMAL for e in st.endpoints
    )


class Watch:
    """Polls the controller's and the coordinator's view of one instance (what each saw)."""

    def __init__(self, f: Fleet, instance_id: int) -> None:
        self.f, self.iid = f, instance_id
        self.states: list[int] = []
        self.coordinator: list[int | None] = []

    async def run(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                mi = next((m for m in await self.f.instances() if m.instance.id == self.iid), None)
                if mi is not None and (not self.states or self.states[-1] != mi.state):
                    self.states.append(mi.state)
                st = (await self.f.coordinator_view()).get(self.iid)
                if not self.coordinator or self.coordinator[-1] != st:
                    self.coordinator.append(st)
            await asyncio.sleep(0.02)


async def test_killed_prefill_engine_is_relaunched_in_place_and_serves_again_under_load(tmp_path: Path) -> None:
    async with fleet(tmp_path) as f:
        await start_pd(f)
        mi = await f.live_instance("job-p0")
        assert mi is not None
        port = mi.instance.endpoints[0].business_port
        load = Load(f.gateway.url + "/v1")
        load_task = asyncio.get_running_loop().create_task(load.run())
        watch = Watch(f, mi.instance.id)
        watch_task = asyncio.get_running_loop().create_task(watch.run())
        try:
            await wait_for(lambda: finished(port) >= 5, timeout=10, what="p0 to serve requests")
            old_pid = await engine_pid(f, "p0")
            nm_pid = f.nodes["p0"].proc.proc.pid

            t_kill = time.monotonic()
            os.killpg(old_pid, signal.SIGKILL)
            await wait_for(lambda: relaunched_and_normal(f, "p0", old_pid), timeout=20, what="engine relaunched")
            t_normal = time.monotonic()
            await wait_for(lambda: finished(port) > 0, timeout=15, interval=0.01, what="a request through the new P")
            t_used = time.monotonic()
            await wait_for(lambda: f.active("job-p0"), timeout=10, what="p0 ACTIVE again")

            again = await f.live_instance("job-p0")
            assert again is not None and again.instance.id == mi.instance.id  # relaunched in place
            assert f.nodes["p0"].proc.proc.pid == nm_pid and f.nodes["p0"].restarts == 0
            assert await engine_pid(f, "p0") != old_pid
            assert "[ENGINE RELAUNCH #1]" in f.nodes["p0"].proc.log_text()
            # RECOVERING while the strategy ran: PAUSED on the coordinator, then resumed.
            assert cpb.INSTANCE_STATE_RECOVERING in watch.states
            assert tpb.INSTANCE_STATUS_PAUSED in watch.coordinator
            # The RESUME push follows the controller's ACTIVE by up to one push cycle.
            await wait_for(lambda: watch.coordinator[-1] == tpb.INSTANCE_STATUS_AVAILABLE, timeout=20,
                           what="instance resumed on the coordinator")
            ft = await f.ft_status(mi.instance.id)
            assert ft.strategy == "engine_relaunch" and ft.relaunch_attempts == 1
            assert ft.state == cpb.FAULT_TOLERANCE_STATE_IDLE
            first_ok = load.first_ok_after(t_kill)
            assert first_ok is not None
            failed = load.failures_after(t_kill)
            ok_total = sum(1 for ts, ok in load.results if ts > t_kill and ok)
            print(
                f"\n[relaunch e2e] kill -> engine NORMAL {t_normal - t_kill:.2f}s; kill -> first successful request"
                f" through the relaunched P {t_used - t_kill:.2f}s (±0.01s); kill -> first successful request"
                f" overall {first_ok - t_kill:.3f}s; {ok_total} ok / {failed} failed requests after the kill;"
                f" controller states {watch.states}; coordinator statuses {watch.coordinator}"
            )
        finally:
            load_task.cancel()
            watch_task.cancel()
            await asyncio.gather(load_task, watch_task, return_exceptions=True)


async def test_hung_prefill_engine_is_detected_by_health_probe_and_relaunched(tmp_path: Path) -> None:
    async with fleet(tmp_path) as f:
        await start_pd(f)
        mi = await f.live_instance("job-p0")
        assert mi is not None
        port = mi.instance.endpoints[0].business_port
        old_pid = await engine_pid(f, "p0")
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/sim/fault", data=b'{"mode": "hang"}', method="POST",
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        t0 = time.monotonic()
        urllib.request.urlopen(req, timeout=2).read()
        await wait_for(lambda: relaunched_and_normal(f, "p0", old_pid), timeout=20, what="hung engine relaunched")
        await wait_for(lambda: f.active("job-p0"), timeout=10, what="p0 ACTIVE again")
        again = await f.live_instance("job-p0")
        assert again is not None and again.instance.id == mi.instance.id
        assert f.nodes["p0"].restarts == 0
        log = f.nodes["p0"].proc.log_text()
        assert "HEALTH_PROBE" in log and "[ENGINE RELAUNCH #1]" in log
        print(f"\n[hang e2e] hang -> relaunched engine NORMAL {time.monotonic() - t0:.2f}s")


def sim_fault(port: int, mode: str) -> None:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/sim/fault", data=json.dumps({"mode": mode}).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    urllib.request.urlopen(req, timeout=2).read()


async def nm_probes(log_dir: Path, node: str, outcome: str) -> float:
    """motor_nodemanager_health_probes_total{outcome} on *node*'s nodemanager's /metrics."""
    port = json.loads((log_dir / f"{node}.ports.json").read_text())["metrics"]
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics",
                                                   timeout=aiohttp.ClientTimeout(total=5)) as r:
        text = await r.text()
    line = f'motor_nodemanager_health_probes_total{{outcome="{outcome}"}} '
    return next((float(ln[len(line):]) for ln in text.splitlines() if ln.startswith(line)), 0.0)


async def _more(log_dir: Path, n: float) -> bool:
    return await nm_probes(log_dir, "p0", "healthy") >= n


@pytest.mark.parametrize("threshold", [1, 10])
async def test_one_failed_health_probe_is_no_death_below_the_failure_threshold(tmp_path: Path, threshold: int) -> None:
    """health.failure_threshold: the engine's /health fails (503) until the first failure is seen,
    then answers again. With 10 (room for a loaded box to lift the fault late) the failures are
    logged and swallowed: no fault report, no relaunch, the same engine process NORMAL. With 1 (the
    control) the first one is a death: the engine is relaunched."""
    async with fleet(tmp_path) as f:
        health = {"poll_interval_sec": 0.5, "failure_threshold": threshold}
        await f.add_node("p0", "job-p0", "prefill", health=health, server={"metrics_port": 0})
        await f.add_node("d0", "job-d0", "decode", health=health)
        await wait_for(lambda: f.active("job-p0", "job-d0"), timeout=25, what="2 ACTIVE instances")
        mi = await f.live_instance("job-p0")
        assert mi is not None
        port = mi.instance.endpoints[0].business_port
        old_pid = await engine_pid(f, "p0")
        log = f.nodes["p0"].proc
        await asyncio.to_thread(sim_fault, port, "health_503")
        try:
            if threshold == 1:
                await wait_for(lambda: "engine fault reported" in log.log_text(), timeout=10, what="a fault report")
            else:
                await wait_for(lambda: "engine /health failed (1 of 10" in log.log_text(), timeout=10,
                               what="the first failed probe logged")  # fmt: skip
        finally:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(sim_fault, port, "none")
        if threshold == 1:
            await wait_for(lambda: relaunched_and_normal(f, "p0", old_pid), timeout=20, what="the engine relaunched")
            return
        # probes go on answering 200 (two more seen): the same process NORMAL, no report
        ok0 = await nm_probes(tmp_path, "p0", "healthy")
        await wait_for(lambda: _more(tmp_path, ok0 + 2), timeout=10, what="two healthy probes after the failure")
        assert await nm_probes(tmp_path, "p0", "tolerated") >= 1
        assert await nm_probes(tmp_path, "p0", "failed") == 0
        st = await f.nm_status("p0")
        assert [(e.pid, e.status) for e in st.endpoints] == [(old_pid, tpb.ENDPOINT_STATUS_NORMAL)]
        text = log.log_text()
        assert "engine fault reported" not in text and "[ENGINE RELAUNCH" not in text
        assert "engine /health failed (9 of 10" not in text


async def test_failed_relaunch_falls_back_to_node_restart_and_the_instance_comes_back(tmp_path: Path) -> None:
    async with fleet(tmp_path) as f:
        await start_pd(f)
        node = f.nodes["p0"]
        old_pid = await engine_pid(f, "p0")
        nm_pid = node.proc.proc.pid
        # The next launch refuses to start: engine env is hot-reloaded and read at relaunch.
        refusing = json.loads(json.dumps(node.config))
        refusing["engine"]["env"]["MOTOR_SIM_FAULT"] = "refuse_start"
        node.proc.config_path.write_text(yaml.safe_dump(refusing))
        await wait_for(lambda: "configuration reloaded" in node.proc.log_text(), timeout=20, what="hot reload")
        mi = await f.live_instance("job-p0")
        assert mi is not None
        t_kill = time.monotonic()
        os.killpg(old_pid, signal.SIGKILL)
        await wait_for(lambda: "engine relaunch failed" in node.proc.log_text(), timeout=15, what="relaunch failure")
        # phase 2 ran (the supervisor restarts the node with its original config: engines start again)
        await wait_for(lambda: node.restarts >= 1, timeout=20, what="the node to restart (exit 75 + supervisor)")
        assert "engine relaunch aborted by the controller" in node.proc.log_text()  # not dispatched → abort
        assert node.exit_codes[0] == 75 and node.proc.proc.pid != nm_pid
        ft = await f.ft_status(mi.instance.id)
        assert ft.strategy == "engine_relaunch" and ft.state == cpb.FAULT_TOLERANCE_STATE_FAILED and ft.last_error
        await wait_for(lambda: f.active("job-p0"), timeout=25, what="job-p0 ACTIVE again after the node restart")
        print(f"\n[relaunch-fails e2e] kill -> job-p0 ACTIVE again after node restart {time.monotonic() - t_kill:.2f}s")
