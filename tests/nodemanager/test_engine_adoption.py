"""Engine re-adoption: a nodemanager restarted after it died abnormally (kill -9) takes over the
engines its predecessor launched instead of launching new ones; anything else (a changed launch
plan, a recorded process that is gone or is another process now, the key off, an orderly stop)
behaves as before. Real nodemanager processes, real simulator engines, the fake controller."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as pb
from tests.helpers import wait_for
from tests.nodemanager.conftest import Admin, nm_config
from tests.nodemanager.test_nodemanager_process import Ctl, all_normal, gone, start_request
from tests.procs import NodeManagerProc, start_nodemanager


def config(ctl: Ctl, key_file: str, tmp_path: Path, **over: Any) -> dict[str, Any]:
    server, _ = ctl
    return nm_config(server.port, key_file, tmp_path, endpoints_per_node=1,
                     engine={"state_file": str(tmp_path / "state" / "engines.json"), **over.pop("engine", {})},
                     **over)  # fmt: skip


async def start_and_run(tmp_path: Path, ctl: Ctl, cfg: dict[str, Any], name: str) -> tuple[NodeManagerProc, Admin, int]:
    """A nodemanager that registered and got its start command; returns it, its admin client and the
    engine pid the start command reported."""
    _, impl = ctl
    before = len(impl.registrations)
    nm = await start_nodemanager(tmp_path, cfg, name=name)
    admin = Admin(nm.address)
    await wait_for(lambda: len(impl.registrations) > before, timeout=15, what="registration")
    resp = await admin.call("StartEngines", start_request(impl.registrations[-1]))
    await wait_for(lambda: all_normal(admin), timeout=30, what="engine NORMAL")
    return nm, admin, int(resp.pids[0])


async def kill9(nm: NodeManagerProc) -> None:
    os.kill(nm.proc.pid, signal.SIGKILL)
    await wait_for(lambda: nm.proc.poll() is not None, timeout=10, what="nodemanager killed")


def alive(pid: int) -> bool:
    return not gone(pid)


def engine_port(ctl: Ctl) -> int:
    return int(ctl[1].registrations[-1].endpoints[0].business_port)


async def complete(session: aiohttp.ClientSession, port: int) -> int:
    body = {"model": "sim-model", "prompt": "hello", "max_tokens": 2}
    async with session.post(f"http://127.0.0.1:{port}/v1/completions", json=body,
                            timeout=aiohttp.ClientTimeout(total=5)) as r:  # fmt: skip
        await r.read()
        return r.status


async def test_an_engine_outlives_a_killed_nodemanager_serves_meanwhile_and_is_adopted_by_the_next(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    cfg = config(controller, key_file, tmp_path)
    cfg["server"] = {**cfg["server"], "metrics_port": 0}
    nm, admin, pid = await start_and_run(tmp_path, controller, cfg, "nm1")
    port = engine_port(controller)
    statuses: list[int] = []
    stop = asyncio.Event()

    async def traffic() -> None:
        async with aiohttp.ClientSession() as s:
            while not stop.is_set():
                statuses.append(await complete(s, port))
                await asyncio.sleep(0.02)  # pacing, not synchronisation

    load = asyncio.create_task(traffic())
    nm2: NodeManagerProc | None = None
    try:
        await admin.close()
        await kill9(nm)
        served_before = len(statuses)
        await wait_for(lambda: len(statuses) >= served_before + 5, timeout=10, what="requests while the nodemanager is down")
        assert alive(pid)
        nm2, admin2, pid2 = await start_and_run(tmp_path, controller, cfg, "nm2")
        assert pid2 == pid  # adopted, not launched
        assert engine_port(controller) == port  # the same ports are announced again
        status = await admin2.call("GetStatus", pb.GetStatusRequest())
        assert [e.pid for e in status.endpoints] == [pid]
        assert "engine adopted from the previous nodemanager" in nm2.log_text()
        assert "engine launched" not in nm2.log_text()
        metrics_port = json.loads((tmp_path / "nm2.ports.json").read_text())["metrics"]
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
            assert 'motor_nodemanager_engine_adoptions_total{outcome="adopted"} 1.0' in await r.text()
        await admin2.close()
    finally:
        stop.set()
        await load
        if nm2 is not None:
            assert nm2.terminate() == 0
        elif alive(pid):
            os.killpg(pid, signal.SIGKILL)
    assert statuses and set(statuses) == {200}, f"some requests failed: {sorted(set(statuses))}"
    # an orderly stop of the adopting nodemanager stops the adopted engine and clears the record
    await wait_for(lambda: gone(pid), timeout=10, what="adopted engine stopped with its nodemanager")
    assert not (tmp_path / "state" / "engines.json").exists()


async def test_a_changed_launch_plan_is_not_adopted_the_old_engine_is_stopped_and_a_new_one_launched(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    cfg = config(controller, key_file, tmp_path)
    nm, admin, pid = await start_and_run(tmp_path, controller, cfg, "nm1")
    await admin.close()
    await kill9(nm)
    assert alive(pid)
    changed = config(controller, key_file, tmp_path, engine={"extra_args": ["--max-num-seqs", "128"]})
    nm2, admin2, pid2 = await start_and_run(tmp_path, controller, changed, "nm2")
    try:
        assert pid2 != pid
        await wait_for(lambda: gone(pid), timeout=10, what="the stale engine stopped")
        assert "recorded engine not adopted: launch plan changed" in nm2.log_text()
        assert "--max-num-seqs 128" in " ".join(psutil.Process(pid2).cmdline())
    finally:
        await admin2.close()
        assert nm2.terminate() == 0
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)


async def test_a_recorded_process_that_is_gone_or_another_process_now_is_neither_adopted_nor_signalled(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)  # a process with a "reused" pid
    dead = subprocess.Popen(["true"])
    dead.wait()
    state = tmp_path / "state" / "engines.json"
    state.parent.mkdir()
    rec = {"endpoint_id": 0, "pgid": 0, "start_time": 1, "fingerprint": "x", "business_port": 0}
    state.write_text(json.dumps({"version": 1, "engines": [
        {**rec, "pid": bystander.pid, "pgid": bystander.pid}, {**rec, "pid": dead.pid, "pgid": dead.pid}]}))
    try:
        cfg = config(controller, key_file, tmp_path)
        nm, admin, pid = await start_and_run(tmp_path, controller, cfg, "nm1")
        try:
            assert pid not in (bystander.pid, dead.pid)
            text = nm.log_text()
            assert "recorded engine not adopted: pid reused by another process (not signalled)" in text
            assert "recorded engine not adopted: process gone (not signalled)" in text
            assert bystander.poll() is None
            assert [r["pid"] for r in json.loads(state.read_text())["engines"]] == [pid]
        finally:
            await admin.close()
            assert nm.terminate() == 0
    finally:
        bystander.kill()
        bystander.wait()


async def test_with_adopt_on_restart_off_the_engine_dies_with_a_killed_nodemanager(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    cfg = config(controller, key_file, tmp_path, engine={"adopt_on_restart": False})
    nm, admin, pid = await start_and_run(tmp_path, controller, cfg, "nm1")
    await admin.close()
    try:
        assert not (tmp_path / "state" / "engines.json").exists()
        await kill9(nm)
        await wait_for(lambda: gone(pid), timeout=10, what="engine died with its nodemanager")
    finally:
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)


async def test_an_orderly_stop_still_stops_the_engines_and_leaves_nothing_to_adopt(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    cfg = config(controller, key_file, tmp_path)
    nm, admin, pid = await start_and_run(tmp_path, controller, cfg, "nm1")
    await admin.close()
    state = tmp_path / "state" / "engines.json"
    assert [r["pid"] for r in json.loads(state.read_text())["engines"]] == [pid]
    t0 = time.monotonic()
    try:
        assert nm.terminate() == 0
        await wait_for(lambda: gone(pid), timeout=10, what="engine stopped by the orderly stop")
        assert time.monotonic() - t0 < 15
        assert not state.exists()
    finally:
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)


async def test_an_adopted_engine_that_dies_is_reported_as_a_process_exit_with_an_unknown_exit_code(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    _, impl = controller
    cfg = config(controller, key_file, tmp_path)
    nm, admin, pid = await start_and_run(tmp_path, controller, cfg, "nm1")
    await admin.close()
    await kill9(nm)
    nm2, admin2, pid2 = await start_and_run(tmp_path, controller, cfg, "nm2")
    try:
        assert pid2 == pid
        os.killpg(pid, signal.SIGKILL)
        await wait_for(lambda: any(f.pid == pid for f in impl.faults), timeout=10, what="death of the adopted engine reported")
        assert "adopted engine process exited (not our child: its exit code is unknown)" in nm2.log_text()
    finally:
        await admin2.close()
        assert nm2.terminate() == 0


async def test_an_orderly_stop_before_any_start_command_stops_the_recorded_engines_too(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    _, impl = controller
    cfg = config(controller, key_file, tmp_path)
    nm, admin, pid = await start_and_run(tmp_path, controller, cfg, "nm1")
    await admin.close()
    await kill9(nm)
    before = len(impl.registrations)
    nm2 = await start_nodemanager(tmp_path, cfg, name="nm2")
    try:
        await wait_for(lambda: len(impl.registrations) > before, timeout=15, what="registration")
        assert "waiting for the start command to adopt them" in nm2.log_text()
        assert alive(pid)
        assert nm2.terminate() == 0
        await wait_for(lambda: gone(pid), timeout=10, what="unclaimed recorded engine stopped by the orderly stop")
        assert not (tmp_path / "state" / "engines.json").exists()
    finally:
        nm2.terminate()
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)
