"""The state dir's guards: the per-state-dir lock and the machine-wide port-pick lock, across
real processes (flock is per open file, so a second process is the honest test)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from motor_cli.statedir import PortPickLock, exclusive
from motor_common.errors import FailedPrecondition

HOLD = """
import sys
from pathlib import Path
from motor_cli.statedir import PortPickLock, exclusive
which, path = sys.argv[1], Path(sys.argv[2])
if which == "pick":
    lock = PortPickLock(path=path); assert lock.acquire()
    print("held", flush=True); sys.stdin.read(); lock.release()
else:
    with exclusive(path):
        print("held", flush=True); sys.stdin.read()
"""


def holder(which: str, path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, which, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_motor_up_waits_for_the_port_pick_lock(tmp_path: Path) -> None:
    path = tmp_path / "ports.lock"
    proc = holder("pick", path)
    try:
        waited = time.monotonic()
        assert PortPickLock(timeout=0.5, path=path).acquire() is False  # held elsewhere: waited, then went ahead
        assert time.monotonic() - waited >= 0.5
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)
    lock = PortPickLock(timeout=5, path=path)
    assert lock.acquire() is True  # released by the other process: ours at once
    lock.release()


def test_one_motor_up_per_state_dir(tmp_path: Path) -> None:
    proc = holder("state", tmp_path)
    try:
        with pytest.raises(FailedPrecondition) as err, exclusive(tmp_path):
            pass
        assert f"a fleet is already running in {tmp_path} (motor up pid {proc.pid})" in err.value.message
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)
    with exclusive(tmp_path):  # the kernel released it with the process
        assert (tmp_path / "up.lock").read_text().strip() == str(os.getpid())
