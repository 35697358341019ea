"""The state dir's guards: the per-state-dir lock, the machine-wide port-pick lock and the
machine-wide port claims, across real processes (flock is per open file, and a claim lives as long
as its process, so a second process is the honest test)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from motor_cli.statedir import PortClaims, PortPickLock, exclusive
from motor_common.errors import FailedPrecondition

HOLD = """
import sys
from pathlib import Path
from motor_cli.statedir import PortClaims, PortPickLock, exclusive
which, path = sys.argv[1], Path(sys.argv[2])
if which == "claim":
    claims = PortClaims(path); claims.claim([9300, 9301])
    print("held", flush=True); sys.stdin.read(); claims.release()
elif which == "pick":
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


def test_a_running_motor_ups_ports_stay_claimed_until_it_exits(tmp_path: Path) -> None:
    # Another motor up's programs are down for a restart: their ports are free, but claimed.
    proc = holder("claim", tmp_path)
    mine = PortClaims(tmp_path)
    try:
        assert mine.claimed() == {9300, 9301}
        mine.claim([9100, 9200])
        assert mine.claimed() == {9300, 9301}  # our own claim is not in our way
        assert json.loads((tmp_path / f"{os.getpid()}.json").read_text())["ports"] == [9100, 9200]
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)
    assert mine.claimed() == set()  # released when it stopped
    mine.release()
    assert list(tmp_path.glob("*.json")) == []


def test_a_claim_whose_motor_up_was_killed_is_stale_and_removed(tmp_path: Path) -> None:
    proc = holder("claim", tmp_path)
    proc.kill()  # SIGKILL: no release
    proc.wait(10)
    assert (tmp_path / f"{proc.pid}.json").exists()
    # a live pid that started at another time is a reused pid, not the claimant
    (tmp_path / "1.json").write_text(json.dumps({"pid": 1, "started": 12.0, "ports": [8000]}))
    (tmp_path / "junk.json").write_text("{not json")  # unreadable: holds nothing, left alone
    assert PortClaims(tmp_path).claimed() == set()
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["junk.json"]


def test_the_shared_lock_and_claims_dir_are_open_to_every_user_whatever_the_umask(tmp_path: Path) -> None:
    """They live in the machine's temp dir and are shared by every user; created under umask 022
    they were 0644 / 1755, and another user's motor up failed on them (PermissionError)."""
    old = os.umask(0o022)
    try:
        lock = PortPickLock(path=tmp_path / "ports.lock")
        assert lock.acquire()
        lock.release()
        PortClaims(tmp_path / "claims.d").claim([9300])
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "ports.lock").stat().st_mode) == 0o666
    assert stat.S_IMODE((tmp_path / "claims.d").stat().st_mode) == 0o1777
