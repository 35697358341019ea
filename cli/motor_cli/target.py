"""Which fleet a command talks to, and with which management key: one lookup for every command.

Order, for every ``motor`` command that calls a program: the flag (``--controller``,
``--coordinator``, ``--management-key-file``), then the environment (``MOTOR_CONTROLLER``,
``MOTOR_COORDINATOR``, ``MOTOR_MANAGEMENT_KEY_FILE``), then the fleet ``motor up`` runs in
``--state-dir`` (its ``fleet.json``), then the key ``motor up`` left in the state dir.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

from motor_common.errors import FailedPrecondition

DEFAULT_STATE_DIR = ".motor/up"
FLEET_FILE = "fleet.json"
KEY_FILE = "keys/operator.key"


def pid_alive(pid: int) -> bool:
    """Whether *pid* runs (an exited process its parent has not reaped yet does not)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def process_is(pid: int, started: float) -> bool:
    """Whether process *pid* exists and is the one that started at *started* (``create_time``),
    not a later process that was given the same pid."""
    try:
        return bool(abs(psutil.Process(pid).create_time() - started) < 0.01)
    except psutil.Error:
        return False


def started_at(pid: int) -> float:
    """The start time of process *pid* (what :func:`process_is` compares)."""
    return float(psutil.Process(pid).create_time())


@dataclass(frozen=True)
class RunningFleet:
    """What ``motor up`` wrote into ``fleet.json`` (``alive`` = its process still runs)."""

    path: Path
    data: dict[str, Any]

    @property
    def pid(self) -> int:
        return int(self.data.get("pid", 0))

    @property
    def alive(self) -> bool:
        """The motor up that wrote the file still runs: its pid, and (files from this version on)
        its start time, so a pid reused after a motor up that was killed is not taken for it."""
        if self.pid <= 0 or not pid_alive(self.pid):
            return False
        started = self.data.get("started")
        return started is None or process_is(self.pid, float(started))


def running_fleet(state_dir: str | Path) -> RunningFleet | None:
    """The fleet file of *state_dir*, or None when there is none (or it is unreadable)."""
    path = Path(state_dir) / FLEET_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return RunningFleet(path, data) if isinstance(data, dict) else None


def no_fleet_message(state_dir: str | Path, flag: str) -> str:
    """The sentence a command prints when it needs a running ``motor up`` and there is none."""
    fleet = running_fleet(state_dir)
    if fleet is not None and not fleet.alive:
        return (f"the `motor up` (pid {fleet.pid}) that wrote {fleet.path} is no longer running; "
                f"start the fleet again with `motor up`, or pass {flag}")
    return f"no fleet is running in {state_dir} (no {FLEET_FILE}); start one with `motor up`, or pass {flag}"


def _live(state_dir: str | Path) -> dict[str, Any]:
    fleet = running_fleet(state_dir)
    return fleet.data if fleet is not None and fleet.alive else {}


def controller_address(flag: str | None, state_dir: str | Path) -> str:
    address = flag or os.environ.get("MOTOR_CONTROLLER") or _live(state_dir).get("controller")
    if not address:
        raise FailedPrecondition(no_fleet_message(state_dir, "--controller ADDR"), reason="NO_FLEET")
    return str(address)


def coordinator_address(flag: str | None, state_dir: str | Path, default: str) -> str:
    coordinators = _live(state_dir).get("coordinators") or []
    return str(flag or os.environ.get("MOTOR_COORDINATOR") or (coordinators[0] if coordinators else default))


def coordinator_addresses(flags: list[str] | None, state_dir: str | Path | None) -> list[str]:
    """Coordinators to ask: the flags, else ``MOTOR_COORDINATOR``, else the running fleet's in
    *state_dir* (None: no fleet's)."""
    if flags:
        return list(flags)
    if os.environ.get("MOTOR_COORDINATOR"):
        return [os.environ["MOTOR_COORDINATOR"]]
    return [str(a) for a in _live(state_dir).get("coordinators") or []] if state_dir is not None else []


def management_key_file(flag: str | None, state_dir: str | Path) -> str | None:
    """The key file to use, or None (then calls carry no key)."""
    found = flag or os.environ.get("MOTOR_MANAGEMENT_KEY_FILE") or _live(state_dir).get("management_key_file")
    if found:
        return str(found)
    left = Path(state_dir) / KEY_FILE
    return str(left) if left.is_file() else None


def tls_section(state_dir: str | Path) -> dict[str, Any]:
    """The CLI's TLS files recorded by a running ``motor up --tls`` (empty otherwise)."""
    tls = _live(state_dir).get("tls")
    return dict(tls) if isinstance(tls, dict) else {}
