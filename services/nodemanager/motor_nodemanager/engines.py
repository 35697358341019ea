"""Engine processes as process groups: spawn in a new session, stop = SIGTERM the group, wait,
SIGKILL the group, reap. No orphan may keep a port.

A watcher task per process reports unexpected exits (deduplicated by pid) to ``on_exit``.

Re-adoption (``engine.adopt_on_restart``, see ``adoption.py``): engines are launched without the
parent-death signal, so they outlive a nodemanager that dies abnormally, and every launch is recorded
in the engine state file; the next incarnation :meth:`EngineSupervisor.adopt`s them. An adopted
engine is no child of this process: its exit is watched with a pidfd, it cannot be reaped and its
exit code is unknown (reported as -1). Every orderly stop still stops the engines and clears the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from motor_common.errors import Internal
from motor_common.logs import request_id_var
from motor_common.procs import die_with_parent
from motor_common.tasks import TaskOwner
from motor_nodemanager import adoption
from motor_nodemanager.launch import LaunchPlan

log = logging.getLogger(__name__)

# A process that dies within this window after spawn is a launch failure.
IMMEDIATE_EXIT_SEC = 0.3

ExitCallback = Callable[[int, int, int], None]  # endpoint_id, pid, returncode


@dataclass
class EngineProcess:
    endpoint_id: int
    argv: tuple[str, ...]
    proc: subprocess.Popen[bytes] | None  # None: adopted from a previous incarnation (not our child)
    started_at: float
    log_file: IO[bytes] | None = None
    stopping: bool = False
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    record: adoption.EngineRecord | None = None

    @property
    def pid(self) -> int:
        if self.proc is not None:
            return int(self.proc.pid)
        assert self.record is not None
        return self.record.pid

    @property
    def pgid(self) -> int:
        return self.record.pgid if self.record is not None else self.pid  # session leader: pgid == pid

    @property
    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return not self.exited.is_set()

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None


def _signal_group(pgid: int, sig: int) -> bool:
    """Send *sig* to a process group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - pid reused by someone else
        return False
    return True


def _popen(plan: LaunchPlan, out: IO[bytes] | None, *, pdeathsig: bool = True) -> subprocess.Popen[bytes]:
    # The standard library's spawn (no Python code runs between fork and exec). uvloop's
    # subprocess spawn re-initialises the interpreter in the child, which intermittently crashed
    # (SIGSEGV) next to grpc's threads.
    # die_with_parent (*pdeathsig*): a nodemanager killed with SIGKILL still takes its engines down
    # (SIGTERM), so no orphan engine keeps a port when the node is restarted. Off when the engines
    # are to be re-adopted by the next incarnation instead.
    return subprocess.Popen(
        die_with_parent(plan.argv) if pdeathsig else list(plan.argv),
        env=dict(plan.env),
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT if out is not None else None,
        start_new_session=True,
        close_fds=True,
    )


def _pidfd(pid: int) -> int:
    """A pidfd of *pid*, or -1 (no such process, or a kernel without pidfd)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return -1


async def _readable(fd: int) -> None:
    """Until the pidfd *fd* is readable (its process exited); the caller closes it."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await done
    finally:
        loop.remove_reader(fd)


async def wait_exit(proc: subprocess.Popen[bytes]) -> int:
    """Wait for *proc* to exit without a thread (pidfd when available), then reap it."""
    fd = _pidfd(proc.pid)
    if fd >= 0:
        try:
            if proc.poll() is None:
                await _readable(fd)
        finally:
            os.close(fd)
    else:  # pragma: no cover - kernels without pidfd
        while True:
            if proc.poll() is not None:
                break
            await asyncio.sleep(0.1)
    return int(proc.wait())


async def wait_exit_adopted(rec: adoption.EngineRecord) -> int:
    """Wait for the adopted (non-child) process of *rec* to exit, without a thread. It cannot be
    waited for or reaped: its exit code is unknown (-1)."""
    fd = _pidfd(rec.pid)
    # The pidfd refers to whatever process has the pid now: it is the recorded one only if the
    # start time still matches after it was opened.
    if fd >= 0 and adoption.is_recorded_process(rec):
        try:
            await _readable(fd)
        finally:
            os.close(fd)
    else:
        if fd >= 0:
            os.close(fd)
        while True:  # pragma: no cover - kernels without pidfd
            if not adoption.is_recorded_process(rec):
                break
            await asyncio.sleep(0.1)
    return -1


class EngineSupervisor:
    def __init__(
        self,
        on_exit: ExitCallback | None = None,
        *,
        adopt_on_restart: Callable[[], bool] = lambda: False,
        state_file: Callable[[], str | None] = lambda: None,
    ) -> None:
        """*adopt_on_restart*: launch without the parent-death signal and record the engines in
        *state_file* (when it gives a path) for a next incarnation to adopt."""
        self._on_exit = on_exit
        self._adopt_on_restart = adopt_on_restart
        self._state_file = state_file
        self._procs: dict[int, EngineProcess] = {}
        self._tasks = TaskOwner("engine-watchers")
        self._reported: set[int] = set()

    @property
    def processes(self) -> list[EngineProcess]:
        return [self._procs[k] for k in sorted(self._procs)]

    def pid_of(self, endpoint_id: int) -> int:
        p = self._procs.get(endpoint_id)
        return p.pid if p is not None and p.alive else 0

    @property
    def running(self) -> bool:
        return bool(self._procs)

    async def launch(self, plans: Sequence[LaunchPlan], log_dir: str | None = None, log_prefix: str = "") -> list[int]:
        """Spawn every plan; on any failure stop what started and raise Internal. Engine output
        goes to ``log_dir/[<log_prefix>.]engine-<endpoint id>.log`` (the prefix — the node id —
        keeps the engines of several nodemanagers sharing one log_dir apart)."""
        if self._procs:
            raise Internal("engines are already running", reason="ENGINES_RUNNING")
        started: list[EngineProcess] = []
        try:
            for plan in plans:
                p = self._spawn(plan, log_dir, log_prefix)
                started.append(p)
                self._tasks.spawn(self._watch(p), name=f"watch-engine-{p.endpoint_id}")
            await asyncio.sleep(IMMEDIATE_EXIT_SEC)
            for p in started:
                if not p.alive:
                    raise Internal(
                        f"Failed to start engine: endpoint {p.endpoint_id} process exited immediately "
                        f"with code {p.returncode} ({' '.join(p.argv[:3])} ...)",
                        reason="ENGINE_EXITED_IMMEDIATELY",
                    )
        except BaseException:
            for p in started:
                p.stopping = True
            await asyncio.gather(*(self._stop_one(p, 2.0) for p in started), return_exceptions=True)
            raise
        for p in started:
            self._procs[p.endpoint_id] = p
        if self._adopt_on_restart():
            wall = time.time()
            for p, plan in zip(started, plans, strict=True):
                p.record = adoption.record_of(plan, p.pid, wall)
            self._save()
        return [p.pid for p in started]

    def adopt(self, records: Sequence[adoption.EngineRecord]) -> list[int]:
        """Take over engines a previous incarnation launched (verified by the caller: each is the
        recorded process and its plan matches). Watched with a pidfd; stopped like any other."""
        if self._procs:
            raise Internal("engines are already running", reason="ENGINES_RUNNING")
        for rec in records:
            p = EngineProcess(rec.endpoint_id, (), None, time.monotonic(), record=rec)
            self._procs[rec.endpoint_id] = p
            self._tasks.spawn(self._watch(p), name=f"watch-engine-{p.endpoint_id}")
        self._save()
        return [rec.pid for rec in records]

    def _save(self) -> None:
        path = self._state_file()
        if path is None:
            return
        adoption.save(path, [p.record for p in self.processes if p.record is not None] if self._adopt_on_restart()
                      else [])  # fmt: skip

    def _spawn(self, plan: LaunchPlan, log_dir: str | None, log_prefix: str = "") -> EngineProcess:
        out = _open_log(log_dir, engine_log_name(log_prefix, plan.endpoint.id)) if log_dir else None
        try:
            proc = _popen(plan, out, pdeathsig=not self._adopt_on_restart())
        except OSError as exc:
            if out is not None:
                out.close()
            raise Internal(
                f"Failed to start engine: endpoint {plan.endpoint.id}: {plan.argv[0]}: {exc.strerror or exc}",
                reason="ENGINE_SPAWN_FAILED",
            ) from exc
        log.info(
            "engine launched",
            extra={"endpoint_id": plan.endpoint.id, "pid": proc.pid, "argv": " ".join(plan.argv)},
        )
        return EngineProcess(plan.endpoint.id, plan.argv, proc, time.monotonic(), out)

    async def _watch(self, p: EngineProcess) -> None:
        request_id_var.set("")  # a background task, not part of the request that spawned it
        try:
            rc = await (wait_exit(p.proc) if p.proc is not None else wait_exit_adopted(p.record))  # type: ignore[arg-type]
        finally:
            p.exited.set()
        if p.stopping or p.pid in self._reported:
            return
        self._reported.add(p.pid)
        if p.proc is None:
            log.error("adopted engine process exited (not our child: its exit code is unknown)",
                      extra={"endpoint_id": p.endpoint_id, "pid": p.pid})  # fmt: skip
        else:
            log.error("engine process exited", extra={"endpoint_id": p.endpoint_id, "pid": p.pid, "returncode": rc})
        if self._on_exit is not None:
            self._on_exit(p.endpoint_id, p.pid, rc)

    async def stop_all(self, timeout: float) -> None:
        procs = list(self._procs.values())
        for p in procs:
            p.stopping = True
        await asyncio.gather(*(self._stop_one(p, timeout) for p in procs), return_exceptions=True)
        self._procs.clear()
        self._save()  # an orderly stop leaves nothing to adopt
        await self._tasks.close()
        self._tasks = TaskOwner("engine-watchers")

    async def _stop_one(self, p: EngineProcess, timeout: float) -> None:
        # An adopted leader that exited was reaped by someone else; its group id stays unused by
        # new processes as long as any member of the group lives.
        pgid = p.pgid
        deadline = time.monotonic() + timeout
        if _signal_group(pgid, signal.SIGTERM):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await p.exited.wait()
            # the leader is gone; give the rest of its group the remaining time
            while _group_alive(pgid):
                if time.monotonic() >= deadline:
                    log.warning("engine process group still running after SIGTERM and the stop timeout: SIGKILL",
                                extra={"endpoint_id": p.endpoint_id, "pgid": pgid, "stop_timeout_sec": timeout})
                    break
                await asyncio.sleep(0.05)
            _signal_group(pgid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5.0):  # the watcher reaps it
                await p.exited.wait()
        if p.proc is not None:
            p.proc.wait()  # SIGKILL was sent to its group: returns at once
        if p.log_file is not None:
            p.log_file.close()
        log.info("engine stopped", extra={"endpoint_id": p.endpoint_id, "pid": p.pid, "returncode": p.returncode})


def _group_alive(pgid: int) -> bool:
    """Whether a process of group *pgid* still runs. A zombie does not count: ``kill(…, 0)``
    succeeds on one, and an orphaned engine worker adopted by a nodemanager that is PID 1 of its
    container (no init) stays a zombie until its parent reaps it, which may be never."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    running = group_running(pgid, _proc_stats())
    return True if running is None else running


def parse_stat(text: str) -> tuple[str, int] | None:
    """(state, process group) of a ``/proc/<pid>/stat`` line; None when it cannot be parsed. The
    command name in parentheses may hold spaces and parentheses: the fields start after the last ``)``."""
    fields = text.rpartition(")")[2].split()
    if len(fields) < 3 or not fields[2].lstrip("-").isdigit():
        return None
    return fields[0], int(fields[2])


def group_running(pgid: int, stats: Iterable[str] | None) -> bool | None:
    """Whether any process of group *pgid* among the ``/proc/<pid>/stat`` lines *stats* is neither a
    zombie (Z) nor dead (X) (pure); None when the lines are not available."""
    if stats is None:
        return None
    for text in stats:
        parsed = parse_stat(text)
        if parsed is not None and parsed[1] == pgid and parsed[0] not in ("Z", "X"):
            return True
    return False


def _proc_stats() -> list[str] | None:
    """Every ``/proc/<pid>/stat`` line (processes that end meanwhile are skipped); None without /proc."""
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return None
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                out.append(f.read())
        except OSError:
            continue
    return out


def engine_log_name(prefix: str, endpoint_id: int) -> str:
    """``<prefix>.engine-<id>.log`` (``engine-<id>.log`` without a prefix); path characters of the
    prefix (a node id may be ``host:job:rank``) are replaced."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in prefix).strip(".")
    return f"{safe}.engine-{endpoint_id}.log" if safe else f"engine-{endpoint_id}.log"


def _open_log(log_dir: str, name: str) -> IO[bytes]:
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    return open(Path(log_dir) / name, "ab")  # closed when the engine stops
