"""Running `motor up` from tests: start it, wait until its fleet file says ready, stop it cleanly.

When the fleet does not come up, the failure carries what an operator would look at: the
`motor up` output, the tail of every program's log and the process tree, so a failure on a CI
machine can be diagnosed from the test report alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psutil

from tests.conftest import tool
from tests.helpers import wait_for


class UpFleet:
    """A running `motor up`: its state directory, process and output file."""

    def __init__(self, state: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.state, self.proc, self.log = state, proc, log

    @property
    def info(self) -> dict[str, Any]:
        return dict(json.loads((self.state / "fleet.json").read_text()))

    def diagnostics(self) -> str:
        parts = [f"--- motor up output ({self.log}):\n{_tail(self.log, 80)}"]
        logs = self.state / "logs"
        for path in sorted(logs.glob("*.log")) if logs.is_dir() else ():
            parts.append(f"--- {path.name}:\n{_tail(path, 25)}")
        parts.append(
            f"--- process tree of motor up (pid {self.proc.pid}, exit {self.proc.poll()}):\n{_tree(self.proc.pid)}"
        )
        return "\n".join(parts)


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({exc})"


def _tree(pid: int) -> str:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error as exc:
        return f"({exc})"
    rows = []
    for p in procs:
        try:
            rows.append(
                f"{p.pid:>7} {p.status():<10} cpu {sum(p.cpu_times()[:2]):6.1f}s  {' '.join(p.cmdline())[:160]}"
            )
        except psutil.Error:
            continue
    return "\n".join(rows)


@asynccontextmanager
async def motor_up(tmp_path: Path, *args: str, timeout: float = 90) -> AsyncIterator[UpFleet]:
    """`motor up --port 0 --state-dir … *args*`, ready; stopped with SIGINT (then SIGKILL) on exit."""
    state = tmp_path / "up"
    log = tmp_path / "motor-up.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [tool("motor"), "up", "--port", "0", "--state-dir", str(state), *args],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    fleet = UpFleet(state, proc, log)

    def ready_or_exited() -> bool:
        return proc.poll() is not None or bool(fleet.info.get("ready"))

    try:
        try:
            await wait_for(
                ready_or_exited, timeout=timeout, what=f"motor up {' '.join(args)} ready"
            )
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{fleet.diagnostics()}") from None
        if proc.poll() is not None:
            raise RuntimeError(
                f"motor up exited with {proc.returncode} before it was ready\n{fleet.diagnostics()}"
            )
        yield fleet
    finally:
        await _stop(fleet)


async def _stop(fleet: UpFleet) -> None:
    """SIGCONT every program (a test may have frozen one), then SIGINT: `motor up` stops them all."""
    proc = fleet.proc
    if proc.poll() is not None:
        return
    try:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                os.kill(child.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    except psutil.Error:
        pass
    proc.send_signal(signal.SIGINT)
    try:
        await asyncio.to_thread(proc.wait, 20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        await asyncio.to_thread(proc.wait, 10)


def motor_down(up: UpFleet) -> list[int]:
    """`motor down` on *up*'s fleet: it answers "stopped" and `motor up` exits 0. Returns the pids
    of every process the fleet ran (for :func:`all_gone`)."""
    pids = [p.pid for p in psutil.Process(up.proc.pid).children(recursive=True)]
    down = subprocess.run([tool("motor"), "down", "--state-dir", str(up.state)],
                          capture_output=True, text=True, timeout=60)
    assert (down.returncode, down.stdout.strip()) == (0, "stopped"), down.stderr
    assert up.proc.wait(30) == 0
    return pids


async def all_gone(pids: list[int], what: str) -> None:
    """Every process of *pids* ended (zombies count as ended), within 10 s."""

    def gone() -> bool:
        return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)

    await wait_for(gone, timeout=10, what=what)
