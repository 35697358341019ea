"""Ctrl-C (or SIGHUP) on `motor up` leaves no process behind, even an engine that ignores SIGTERM.

Real processes: `motor up` with simulated engines started with ``MOTOR_SIM_IGNORE_SIGTERM=1`` (a
wedged engine: only SIGKILL stops it) and a nodemanager engine stop timeout (60 s) longer than
`motor up`'s grace, so `motor up` must SIGKILL the nodemanagers and the engines are orphaned — the
worst case. `motor up` must find and kill them, and only then say "no process left running".
"""

from __future__ import annotations

import signal
from pathlib import Path

import psutil
import pytest
import yaml

from tests.helpers import wait_for
from tests.motor_up import motor_up

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


async def test_ctrl_c_kills_engines_that_ignore_sigterm_before_saying_nothing_is_left(tmp_path: Path) -> None:
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(yaml.safe_dump({"nodemanager": {"engine": {
        "env": {"MOTOR_SIM_IGNORE_SIGTERM": "1"}, "stop_timeout_sec": 60.0}}}))
    async with motor_up(tmp_path, "--prefill", "1", "--decode", "1", "--zero-latency", "--config", str(cfg)) as fleet:
        nms = [p["pid"] for p in fleet.info["programs"].values() if p["kind"] == "nodemanager"]
        engines = [c.pid for pid in nms for c in psutil.Process(pid).children(recursive=True)]
        assert len(engines) >= 2
        every = [c.pid for c in psutil.Process(fleet.proc.pid).children(recursive=True)]
        fleet.proc.send_signal(signal.SIGINT)
        assert fleet.proc.wait(60) == 0
        out = fleet.log.read_text()
        assert all(gone(p) for p in engines), [p for p in engines if not gone(p)]
        assert all(gone(p) for p in every), [p for p in every if not gone(p)]
        assert "outlived their program" in out and "motor-sim" in out.split("outlived their program")[1]
        assert out.rstrip().endswith("Stopped; no process left running.")
    await wait_for(lambda: all(gone(p) for p in every), timeout=5, what="nothing left")


async def test_sighup_when_its_terminal_closes_stops_the_fleet_like_ctrl_c(tmp_path: Path) -> None:
    async with motor_up(tmp_path, "--zero-latency") as fleet:
        every = [c.pid for c in psutil.Process(fleet.proc.pid).children(recursive=True)]
        fleet.proc.send_signal(signal.SIGHUP)  # before: motor up died at once, stopping nothing itself
        assert fleet.proc.wait(60) == 0
        assert fleet.log.read_text().rstrip().endswith("Stopped; no process left running.")
        assert not (fleet.state / "fleet.json").exists()
    await wait_for(lambda: all(gone(p) for p in every), timeout=5, what="nothing left")
