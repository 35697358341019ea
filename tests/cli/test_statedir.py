"""The state dir's guards: the per-state-dir lock, the machine-wide port-pick lock and the
machine-wide port claims, across real processes (flock is per open file, and a claim lives as long
as its process, so a second process is the honest test)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from motor_cli.fleet import FleetOptions, plan_fleet
from motor_cli.statedir import PortClaims, PortPickLock, exclusive
from motor_cli.up import _write_keys
from motor_common.errors import ConfigError, FailedPrecondition
from tests.conftest import tool

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


def motor_up(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("motor"), "up", "--port", "0", "--state-dir", str(state), *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_a_state_dir_every_user_can_write_is_refused_and_nothing_is_written_through_its_symlinks(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: another user planted up.lock -> a file of ours
    (shared / "up.lock").symlink_to(victim)
    run = motor_up(shared)
    assert run.returncode == 2, run.stderr
    assert run.stderr == (f"error: state dir {shared} can be written by every user (mode 1777): whoever can write "
                          f"there can make motor up overwrite a file of yours through a planted symlink; use a "
                          f"directory of your own (chmod o-w it) or pass another --state-dir\n")
    assert victim.read_text() == "precious\n" and sorted(p.name for p in shared.iterdir()) == ["up.lock"]


def test_a_new_state_dir_is_private_and_one_that_cannot_be_made_is_one_sentence(tmp_path: Path) -> None:
    with exclusive(tmp_path / "a" / "up"):
        assert stat.S_IMODE((tmp_path / "a" / "up").stat().st_mode) == 0o700
    (tmp_path / "file").write_text("")
    run = motor_up(tmp_path / "file" / "up")
    assert run.returncode == 2
    assert run.stderr == f"error: {tmp_path}/file/up: Not a directory; pass another --state-dir (or fix that one)\n"


def test_an_empty_key_left_by_a_crash_is_made_anew_and_keys_replace_planted_symlinks(tmp_path: Path) -> None:
    state = tmp_path / "up"
    opts = FleetOptions(node_ports=(7001, 7002), state_dir=state, key_file=state / "keys" / "operator.key")
    plan = plan_fleet(opts, Path("/bin"))
    (state / "keys").mkdir(parents=True)
    plan.keys.own["controller"].write_text("")  # a crash between creating the file and writing it
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    plan.keys.nodes.symlink_to(victim)
    _write_keys(plan)
    for path in (plan.keys.operator, plan.keys.nodes, *plan.keys.own.values()):
        assert not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) == 0o600, path
    controller_key = plan.keys.own["controller"].read_text().strip()
    assert len(controller_key) == 48
    assert f"controller: {controller_key}\n" in plan.keys.operators.read_text()
    assert victim.read_text() == "precious\n"
    assert not [p.name for p in (state / "keys").iterdir() if p.name.startswith(".")]  # no temp file left


def test_motor_down_stops_a_motor_up_that_holds_the_state_dir_but_has_not_written_fleet_json(
    tmp_path: Path,
) -> None:
    state = tmp_path / "up"
    starting = holder("state", state)  # a motor up between taking the lock and writing fleet.json
    try:
        down = subprocess.run([tool("motor"), "down", "--state-dir", str(state)], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert (down.returncode, down.stdout) == (0, "stopped\n"), down.stderr  # was: "nothing to stop", exit 1
        assert starting.wait(10) == -signal.SIGTERM
    finally:
        starting.kill()
        starting.wait(10)
    again = subprocess.run([tool("motor"), "down", "--state-dir", str(state)], capture_output=True, text=True,
                           timeout=60)  # fmt: skip
    assert again.returncode == 1 and again.stderr.startswith("error: nothing to stop: no fleet is running in")


def test_a_claim_is_never_written_through_a_symlink_planted_in_the_shared_claims_dir(tmp_path: Path) -> None:
    shared = tmp_path / "claims"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (shared / f".{os.getpid()}.tmp").symlink_to(victim)  # another user's guess of our temp name
    claims = PortClaims(shared)
    claims.claim([9300])
    try:
        assert victim.read_text() == "precious\n"  # was: the claim's JSON, and <pid>.json a symlink to it
        own = shared / f"{os.getpid()}.json"
        assert not own.is_symlink() and json.loads(own.read_text())["ports"] == [9300]
        assert stat.S_IMODE(own.stat().st_mode) == 0o644  # every other motor up reads it, whatever our umask
    finally:
        claims.release()


def test_a_symlink_planted_at_the_shared_lock_or_claims_path_is_refused_and_never_chmodded_through(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "authorized_keys"
    secret.write_text("ssh-ed25519 AAAA me\n")
    secret.chmod(0o600)
    (tmp_path / "ports.lock").symlink_to(secret)
    with pytest.raises(ConfigError, match=r"ports\.lock \(shared by every motor up on this machine\) is a symbolic"):
        PortPickLock(timeout=1, path=tmp_path / "ports.lock").acquire()
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600  # was 0666: writable by every user
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (tmp_path / "claims.d").symlink_to(home)
    with pytest.raises(ConfigError, match=r"claims\.d \(shared by every motor up on this machine\) is a symbolic"):
        PortClaims(tmp_path / "claims.d").claim([9300])
    assert stat.S_IMODE(home.stat().st_mode) == 0o700 and not list(home.iterdir())  # was 1777, with a claim in it
