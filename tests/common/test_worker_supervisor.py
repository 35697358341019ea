"""``motor_common.worker_supervisor`` owned from an event loop (``run`` and ``shutdown``, the way the
coordinator's co-located front runs its workers), with real child processes: a tiny Python
script that beats, writes its ports file and behaves as each test needs. The gateway's blocking
``supervise`` is exercised through ``motor-gateway --workers N`` (tests/gateway/test_workers.py)."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import pytest

from motor_common.worker_policy import RestartPolicy
from motor_common.worker_supervisor import (
    MULTIPROC_ENV,
    Command,
    Supervisor,
    WorkerNames,
    drained_cleanly,
    popen,
    run,
    shutdown,
    worker_registry,
)
from tests.helpers import wait_for

NAMES = WorkerNames(label="test front", metric_prefix="motor_test_front", logger="motor_test.front")

# argv: state_dir index ports_file mode. Modes (only the first incarnation of a slot, marked by a
# file, behaves so; later ones serve): "exit" ends with code 3 once it served, "silent" serves
# without heartbeats, "ignore-term" ignores SIGTERM (every incarnation). Else: SIGTERM exits 0.
CHILD = r"""
import os, signal, sys, time
state_dir, index, ports_file, mode = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
marker = os.path.join(state_dir, "first-" + index)
first = not os.path.exists(marker)
open(marker, "a").close()
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
beat = os.path.join(state_dir, "w" + index + ".beat")
silent = first and mode == "silent"
if not silent:
    open(beat, "a").close()
tmp = ports_file + ".tmp"
with open(tmp, "w") as fh:
    fh.write('{"pid": %d, "env": "%s", "multiproc": "%s"}' % (
        os.getpid(), os.environ.get("MOTOR_TEST_EXTRA", ""), os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")))
os.replace(tmp, ports_file)
if first and mode == "exit":
    sys.exit(3)
while True:
    if not silent:
        os.utime(beat)
    time.sleep(0.2)
"""


def child_command(state_dir: Path, modes: dict[int, str]) -> Command:
    def command(index: int, ports_file: str) -> list[str]:
        return [sys.executable, "-c", CHILD, str(state_dir), str(index), ports_file, modes.get(index, "serve")]
    return command


def ports(sup: Supervisor, index: int) -> dict[str, object]:
    out: dict[str, object] = orjson.loads(Path(sup.ports_file(index)).read_bytes())
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@asynccontextmanager
async def supervised(sup: Supervisor, on_served: Callable[[], None] | None = None) -> AsyncIterator[asyncio.Event]:
    """``run`` as a task, stopped on the way out; a failing test leaves no child behind."""
    stop = asyncio.Event()
    task = asyncio.create_task(run(sup, stop, on_served=on_served))
    try:
        yield stop
    except BaseException:
        stop.set()
        await task
        await shutdown(sup, grace=0.0)
        raise
    stop.set()
    await task


def supervisor(tmp_path: Path, workers: int, modes: dict[int, str], **kw: object) -> Supervisor:
    return Supervisor(workers, child_command(tmp_path, modes), str(tmp_path), names=NAMES,
                      policy=RestartPolicy(base_delay=0.05, max_delay=0.05), **kw)  # type: ignore[arg-type]


async def test_a_worker_that_exits_is_restarted_and_counted_and_shutdown_drains_every_worker(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=NAMES.logger)
    served: list[bool] = []
    sup = supervisor(tmp_path, 2, {0: "exit"}, liveness_timeout=30.0, env={"MOTOR_TEST_EXTRA": "from-caller"})
    async with supervised(sup, on_served=lambda: served.append(True)) as stop:
        await wait_for(lambda: sup.restarts["exited"] == 1 and sup.all_served() and sup.running() == 2,
                       timeout=60, what="slot 0 restarted after its exit and serving again")
        assert sup.restarts == {"exited": 1, "unresponsive": 0}
        status = orjson.loads((tmp_path / "supervisor.json").read_bytes())
        assert status == {"configured": 2, "running": 2, "restarts": {"exited": 1, "unresponsive": 0},
                          "spawn_failures": 0}
        samples = {(s.name, tuple(s.labels.values())): s.value
                   for m in worker_registry(str(tmp_path), NAMES).collect() for s in m.samples}
        assert samples[("motor_test_front_workers", ("running",))] == 2
        assert samples[("motor_test_front_worker_restarts_total", ("exited",))] == 1
        assert "test front worker died; restarting it" in caplog.text
        # The caller's variables and the multiprocess directory reach the children.
        assert ports(sup, 1)["env"] == "from-caller"
        assert ports(sup, 1)["multiproc"] == str(tmp_path / "metrics")
        assert MULTIPROC_ENV not in os.environ
        pids = sup.pids()
        assert len(pids) == 2 and all(alive(p) for p in pids)
        stop.set()
    assert served == [True]
    codes = await shutdown(sup, grace=30.0)
    assert codes == {0: 0, 1: 0}
    assert drained_cleanly(codes)
    assert sup.pids() == [] and sup.running() == 0
    assert not any(alive(p) for p in pids)
    assert "test front worker did not stop" not in caplog.text


async def test_a_failed_spawn_is_retried_later_and_leaves_the_other_workers_alone(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A restart whose fork fails (EAGAIN at the pids limit) neither ends the supervising task nor
    touches the other worker; the slot is spawned again after the restart delay."""
    failing = [0]

    def flaky(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        if failing[0]:
            failing[0] -= 1
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        return popen(argv, env)

    sup = supervisor(tmp_path, 2, {}, liveness_timeout=30.0, spawn=flaky)
    stop = asyncio.Event()
    task = asyncio.create_task(run(sup, stop))
    try:
        await wait_for(sup.all_served, timeout=60, what="both workers serving")
        first, other = ports(sup, 0)["pid"], ports(sup, 1)["pid"]
        assert isinstance(first, int) and isinstance(other, int)
        failing[0] = 1
        os.kill(first, signal.SIGKILL)
        await wait_for(lambda: sup.spawn_failures == 1 and sup.all_served() and ports(sup, 0)["pid"] != first,
                       timeout=60, what="slot 0 spawned again after its failed spawn")
        assert not task.done()
        assert ports(sup, 1)["pid"] == other and alive(other)
        assert sup.restarts == {"exited": 1, "unresponsive": 0}
        assert orjson.loads((tmp_path / "supervisor.json").read_bytes())["spawn_failures"] == 1
        assert "test front worker could not be started; trying again" in caplog.text
    finally:
        stop.set()
        await task
        await shutdown(sup, grace=30.0)


async def test_a_wall_clock_step_forward_kills_no_beating_worker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The liveness check reads no wall clock: with ``time.time()`` 15 s ahead (an NTP step, a VM
    resumed) and a 10 s timeout, workers that keep beating are left running."""
    sup = supervisor(tmp_path, 2, {}, liveness_timeout=10.0)
    passes = [0]
    step = sup.step

    def counted(now: float) -> bool:
        passes[0] += 1
        return step(now)

    sup.step = counted  # type: ignore[method-assign]
    async with supervised(sup):
        await wait_for(sup.all_served, timeout=60, what="both workers serving")
        pids = sup.pids()
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 15.0)
        seen = passes[0]
        await wait_for(lambda: passes[0] >= seen + 10, timeout=60, what="ten supervisor passes")
        monkeypatch.undo()
        assert sup.restarts == {"exited": 0, "unresponsive": 0}
        assert sup.pids() == pids and all(alive(p) for p in pids)
    await shutdown(sup, grace=30.0)


async def test_a_worker_without_heartbeats_is_killed_and_restarted(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, 1, {0: "silent"}, liveness_timeout=30.0, startup_grace=1.0)
    async with supervised(sup):
        await wait_for(lambda: sup.restarts["unresponsive"] == 1 and sup.all_served(), timeout=60,
                       what="the silent worker replaced")
        assert sup.restarts["exited"] == 0
    codes = await shutdown(sup, grace=30.0)
    assert codes == {0: 0}


async def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sup = supervisor(tmp_path, 2, {0: "ignore-term"}, liveness_timeout=30.0)
    async with supervised(sup):
        await wait_for(sup.all_served, timeout=60, what="both workers serving (SIGTERM ignored by slot 0)")
        stubborn = ports(sup, 0)["pid"]
        assert isinstance(stubborn, int)
    started = time.monotonic()
    codes = await shutdown(sup, grace=1.0)
    assert time.monotonic() - started >= 1.0
    assert codes == {0: -signal.SIGKILL, 1: 0}
    assert not drained_cleanly(codes)
    assert not alive(stubborn)
    assert "test front worker did not stop within the grace period; killing it" in caplog.text


async def test_step_never_blocks_the_loop(tmp_path: Path) -> None:
    """``step`` only polls: with workers running (and none to reap) it returns at once."""
    sup = supervisor(tmp_path, 2, {}, liveness_timeout=30.0)
    async with supervised(sup):
        await wait_for(sup.all_served, timeout=60, what="both workers serving")
        started = time.monotonic()
        for _ in range(100):
            assert sup.step(time.monotonic())
        assert time.monotonic() - started < 5.0  # 100 polls of 2 processes: milliseconds; a wait would be seconds
