"""N worker processes of one program on one listening port, under one supervising parent: the
gateway's ``--workers N`` and the coordinator's co-located front. What the workers run, what the
log lines call them and what the metrics are named come from the caller (:class:`WorkerNames`,
a *command* per slot).

* **One port.** The parent binds a ``SO_REUSEPORT`` socket without listening (:func:`reserve_port`:
  it holds the port, also while every worker is being restarted); each worker binds its own
  listening socket on the same port and the kernel spreads new connections over the listening ones.
* **Supervised.** A worker that exits is logged and restarted (at once, then with a doubling
  delay while it keeps dying young: :class:`motor_common.worker_policy.RestartPolicy`). Each worker
  touches a heartbeat file every second from its event loop (:func:`beat_forever`); one silent for
  the liveness timeout (a wedged loop: the kernel would still hand it connections) is killed and
  restarted. Silence is measured on the parent's monotonic clock (a heartbeat is a change of the
  file's stamp, :class:`motor_common.worker_policy.Heartbeat`), so a wall-clock step kills no one.
  A restart that cannot be spawned (fork or exec failed: ``EAGAIN`` at the cgroup's pids limit,
  ``ENOMEM``) is logged, counted and tried again with the same doubling delay; the other workers
  are left alone. On stop the parent forwards its signal to every worker, which stop listening and drain
  their requests; stragglers are killed after the grace period. A worker gets SIGTERM when the
  parent dies (``PR_SET_PDEATHSIG`` through :func:`motor_common.procs.die_with_parent`'s exec shim,
  safe in a parent with threads).
* **One view.** The workers share a Prometheus multiprocess directory (``prometheus_client``'s
  multiprocess mode, :data:`MULTIPROC_ENV` set for them): a scrape of ``/metrics``
  (:func:`worker_registry`), whichever worker the connection lands on, sums the counters and
  histograms of every worker, past incarnations included, and the in-flight gauges of the live
  ones (``livesum``). The parent adds ``<prefix>_workers{state}`` (configured, running) and
  ``<prefix>_worker_restarts_total{reason}`` and ``<prefix>_worker_spawn_failures_total`` through a
  status file the workers' collector reads (written best-effort: a full disk stops no supervision).

Two ways to own a :class:`Supervisor`: the blocking :func:`supervise` (a process that is only a
supervisor: its own signal handlers, exit code), or :func:`run` and :func:`shutdown` from a process
that already runs an event loop (``Supervisor.step`` only polls, it never blocks).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from motor_common.errors import ConfigError
from motor_common.ports import bind_failure
from motor_common.procs import die_with_parent
from motor_common.runner import write_ports_file
from motor_common.worker_policy import Heartbeat, RestartPolicy

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
STATUS_FILE = "supervisor.json"
HEARTBEAT_INTERVAL_SEC = 1.0
# Before its first heartbeat a worker imports, reads its files and binds: allow this much more.
STARTUP_GRACE_SEC = 60.0
RESTART_REASONS = ("exited", "unresponsive")
# A worker ended by the forwarded signal itself had not installed its handler yet: not serving.
CLEAN_EXITS = frozenset({0, -signal.SIGTERM, -signal.SIGINT})
# After SIGKILL the kernel ends a process at once; this only bounds a wait on one stuck in the kernel.
KILL_WAIT_SEC = 5.0

Command = Callable[[int, str], list[str]]
"""A slot's command line: ``command(index, ports_file)``; the worker writes its bound ports to
*ports_file* (``write_ports_file``) once it serves."""
Spawn = Callable[[list[str], dict[str, str]], subprocess.Popen[bytes]]
"""Starts a worker: ``spawn(argv, env)``; raises ``OSError`` when the process cannot be created."""


def popen(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, env=env)


@dataclass(frozen=True)
class WorkerNames:
    """How a supervisor's workers appear in its log lines and metrics."""

    label: str  # "gateway": "gateway worker started", "gateway stopping: draining every worker"
    metric_prefix: str  # "motor_gateway": motor_gateway_workers, motor_gateway_worker_restarts_total
    logger: str  # the logger of the supervisor's lines


def beat_path(state_dir: str, index: int) -> Path:
    return Path(state_dir) / f"w{index}.beat"


def beat(state_dir: str, index: int) -> None:
    """The worker's heartbeat (called from its event loop): touch ``w<index>.beat``."""
    path = beat_path(state_dir, index)
    try:
        os.utime(path)
    except FileNotFoundError:
        path.touch()


async def beat_forever(state_dir: str, index: int) -> None:
    """A worker's heartbeat task (own it with a ``TaskOwner``): a beat every second."""
    while True:
        beat(state_dir, index)
        await asyncio.sleep(HEARTBEAT_INTERVAL_SEC)


class _SupervisorCollector:
    """``<prefix>_workers`` and ``<prefix>_worker_restarts_total`` from the parent's status file
    (read at each scrape)."""

    def __init__(self, state_dir: str, names: WorkerNames) -> None:
        self.path = Path(state_dir) / STATUS_FILE
        self.names = names

    def collect(self) -> Iterable[Metric]:
        try:
            status: dict[str, Any] = orjson.loads(self.path.read_bytes())
        except (OSError, ValueError):
            return []
        what = self.names.label[:1].upper() + self.names.label[1:]
        workers = GaugeMetricFamily(f"{self.names.metric_prefix}_workers",
                                    f"{what} worker processes: configured, and running now.", labels=["state"])
        workers.add_metric(["configured"], float(status.get("configured", 0)))
        workers.add_metric(["running"], float(status.get("running", 0)))
        restarts = CounterMetricFamily(f"{self.names.metric_prefix}_worker_restarts",
                                       f"{what} workers restarted by the supervisor, by reason "
                                       "(exited: the process ended; unresponsive: no heartbeat).",
                                       labels=["reason"])
        counts = status.get("restarts", {})
        for reason in RESTART_REASONS:
            restarts.add_metric([reason], float(counts.get(reason, 0)))
        failures = CounterMetricFamily(f"{self.names.metric_prefix}_worker_spawn_failures",
                                       f"{what} workers the supervisor could not start (fork or exec "
                                       "failed); each is tried again after a delay.")
        failures.add_metric([], float(status.get("spawn_failures", 0)))
        return [workers, restarts, failures]


def metrics_dir(state_dir: str) -> Path:
    """The workers' Prometheus multiprocess directory (:data:`MULTIPROC_ENV`)."""
    return Path(state_dir) / "metrics"


def worker_registry(state_dir: str, names: WorkerNames) -> CollectorRegistry:
    """What a worker's ``/metrics`` serves: every worker's metrics (the multiprocess directory)
    and the supervisor's."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics_dir(state_dir)))  # type: ignore[no-untyped-call]
    registry.register(_SupervisorCollector(state_dir, names))
    return registry


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind (not listen) a SO_REUSEPORT socket: fixes the port for the workers (port 0 = any)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(bind_failure(host, port, detail=exc.strerror or "")) from exc
    return sock


@dataclass
class _Slot:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0  # monotonic time of the spawn
    heartbeat: Heartbeat = field(default_factory=lambda: Heartbeat(0.0))
    restart_at: float = 0.0
    quick_deaths: int = 0
    killed_unresponsive: bool = False
    served: bool = False  # has written its ports file once (this incarnation)


@dataclass
class Supervisor:
    """Runs ``command(i, ports_file)`` for each slot ``i`` of ``workers``, restarting what dies.
    *state_dir* (the caller's, existing) holds the heartbeats, ports files, status file and the
    metrics directory. The children get this process's environment plus *env* and
    :data:`MULTIPROC_ENV`. Times (``step``'s *now*) are ``time.monotonic()``."""

    workers: int
    command: Command
    state_dir: str
    liveness_timeout: float
    names: WorkerNames
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    startup_grace: float = STARTUP_GRACE_SEC
    env: Mapping[str, str] = field(default_factory=dict)
    spawn: Spawn = popen
    slots: list[_Slot] = field(init=False)
    restarts: dict[str, int] = field(init=False)
    spawn_failures: int = 0
    stopping: bool = False
    exit_codes: dict[int, int] = field(default_factory=dict)  # slot -> code, of those ended while stopping
    log: logging.Logger = field(init=False)

    def __post_init__(self) -> None:
        self.slots = [_Slot(i) for i in range(self.workers)]
        self.restarts = dict.fromkeys(RESTART_REASONS, 0)
        self.log = logging.getLogger(self.names.logger)
        metrics_dir(self.state_dir).mkdir(parents=True, exist_ok=True)

    def ports_file(self, index: int) -> str:
        return os.path.join(self.state_dir, f"w{index}.json")

    def _spawn(self, slot: _Slot, now: float) -> None:
        """Start *slot*'s worker; when the process cannot be created, log, count and schedule
        another try (the restart policy's delay, as for a worker that died at once)."""
        with contextlib.suppress(OSError):
            beat_path(self.state_dir, slot.index).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            os.unlink(self.ports_file(slot.index))
        cmd = die_with_parent(self.command(slot.index, self.ports_file(slot.index)))
        env = {**os.environ, **self.env, MULTIPROC_ENV: str(metrics_dir(self.state_dir))}
        try:
            slot.proc = self.spawn(cmd, env)
        except (OSError, subprocess.SubprocessError) as exc:
            delay, slot.quick_deaths = self.policy.next_delay(0.0, slot.quick_deaths)
            slot.restart_at = now + delay
            self.spawn_failures += 1
            self.log.error(f"{self.names.label} worker could not be started; trying again", extra={
                "worker": slot.index, "error": str(exc), "retry_in_sec": delay})
            return
        slot.started = now
        slot.heartbeat = Heartbeat(now)
        slot.killed_unresponsive = False
        slot.served = False
        self.log.info(f"{self.names.label} worker started", extra={"worker": slot.index, "pid": slot.proc.pid})

    def _write_status(self) -> None:
        """Best-effort: the workers' metrics read it; a full disk must not stop the supervision."""
        try:
            write_ports_file(os.path.join(self.state_dir, STATUS_FILE),
                             {"configured": self.workers, "running": self.running(), "spawn_failures": self.spawn_failures,
                              "restarts": self.restarts})  # type: ignore[dict-item]
        except OSError as exc:
            self.log.warning(f"{self.names.label} supervisor could not write its status file",
                             extra={"error": str(exc)})

    def running(self) -> int:
        return sum(1 for s in self.slots if s.proc is not None and s.proc.poll() is None)

    def pids(self) -> list[int]:
        """The pids of the workers not reaped yet."""
        return [s.proc.pid for s in self.slots if s.proc is not None]

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Forward *signum* to every running worker; no restarts from now on."""
        self.stopping = True
        for s in self.slots:
            if s.proc is not None and s.proc.poll() is None:
                s.proc.send_signal(signum)

    def _reap(self, slot: _Slot, code: int, now: float) -> None:
        assert slot.proc is not None
        pid = slot.proc.pid
        mark_process_dead(pid, str(metrics_dir(self.state_dir)))  # type: ignore[no-untyped-call]
        slot.proc = None
        if self.stopping:
            self.exit_codes[slot.index] = code
            self.log.info(f"{self.names.label} worker stopped", extra={"worker": slot.index, "pid": pid, "code": code})
            return
        reason = "unresponsive" if slot.killed_unresponsive else "exited"
        delay, slot.quick_deaths = self.policy.next_delay(now - slot.started, slot.quick_deaths)
        slot.restart_at = now + delay
        self.restarts[reason] += 1
        self.log.error(f"{self.names.label} worker died; restarting it", extra={
            "worker": slot.index, "pid": pid, "code": code, "reason": reason,
            "uptime_sec": round(now - slot.started, 3), "restart_in_sec": delay})

    def step(self, now: float) -> bool:
        """One pass (never blocks: polls only): reap, kill the unresponsive, restart. False once
        stopping and every worker is gone."""
        changed = False
        for slot in self.slots:
            if slot.proc is None:
                if not self.stopping and now >= slot.restart_at:
                    self._spawn(slot, now)
                    changed = True
                continue
            code = slot.proc.poll()
            if code is not None:
                self._reap(slot, code, now)
                changed = True
                continue
            if not slot.served and os.path.exists(self.ports_file(slot.index)):
                slot.served = True
            if self.stopping or slot.killed_unresponsive:
                continue
            try:
                stamp: int | None = beat_path(self.state_dir, slot.index).stat().st_mtime_ns
            except FileNotFoundError:
                stamp = None
            slot.heartbeat.observe(now, stamp)
            if slot.heartbeat.unresponsive(now, self.liveness_timeout, self.startup_grace):
                self.log.error(f"{self.names.label} worker unresponsive (no heartbeat); killing it", extra={
                    "worker": slot.index, "pid": slot.proc.pid, "timeout_sec": self.liveness_timeout})
                slot.killed_unresponsive = True
                slot.proc.kill()
        if changed:
            self._write_status()
        return not (self.stopping and all(s.proc is None for s in self.slots))

    def all_served(self) -> bool:
        """Every slot has a worker whose current incarnation has written its ports file."""
        return all(s.proc is not None and s.served for s in self.slots)

    def kill_stragglers(self) -> None:
        for s in self.slots:
            if s.proc is not None and s.proc.poll() is None:
                self.log.error(f"{self.names.label} worker did not stop within the grace period; killing it",
                               extra={"worker": s.index, "pid": s.proc.pid})
                s.proc.kill()


def _step(sup: Supervisor) -> bool:
    """:meth:`Supervisor.step` now; an unexpected error in one pass is logged and the supervision
    goes on (the next pass retries): it neither ends the supervising task nor kills the workers."""
    try:
        return sup.step(time.monotonic())
    except Exception:
        sup.log.exception(f"{sup.names.label} supervisor pass failed; continuing")
        return True


def drained_cleanly(exit_codes: Mapping[int, int]) -> bool:
    """Whether every worker ended cleanly while stopping: a worker that failed or had to be
    killed while draining makes a supervisor's exit non-zero."""
    return all(c in CLEAN_EXITS for c in exit_codes.values())


async def run(sup: Supervisor, stop: asyncio.Event, *, on_served: Callable[[], None] | None = None,
              interval: float = 0.05) -> None:
    """Supervise from an event loop until *stop* is set (or the task is cancelled): every
    *interval* seconds one :meth:`Supervisor.step`. *on_served* is called once, when every worker
    has written its ports file. The workers keep running: :func:`shutdown` stops them."""
    served = False
    while not stop.is_set():
        _step(sup)
        if not served and sup.all_served():
            served = True
            if on_served is not None:
                on_served()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval):
                await stop.wait()


async def shutdown(sup: Supervisor, grace: float, *, signum: int = signal.SIGTERM,
                   interval: float = 0.05) -> dict[int, int]:
    """Forward *signum* to every worker, wait (without blocking the loop) up to *grace* seconds
    for all of them to exit, kill the stragglers; the exit code of each worker that ended while
    stopping, by slot (:func:`drained_cleanly` says whether that is a clean stop)."""
    if not sup.stopping:
        sup.log.info(f"{sup.names.label} stopping: draining every worker", extra={"signal": signum})
    sup.stop(signum)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    killed_at: float | None = None
    while _step(sup):
        now = loop.time()
        if killed_at is None and now >= deadline:
            sup.kill_stragglers()
            killed_at = now
        elif killed_at is not None and now - killed_at > KILL_WAIT_SEC:
            sup.log.error(f"{sup.names.label} workers still not reaped after SIGKILL",
                          extra={"pids": sup.pids()})
            break
        await asyncio.sleep(interval)
    return dict(sup.exit_codes)


def supervise(*, workers: int, host: str, port: int, command_for: Callable[[int, str], Command],
              names: WorkerNames, ports_file: str | None, liveness_timeout: float, shutdown_grace: float,
              policy: RestartPolicy | None = None, env: Mapping[str, str] | None = None) -> int:
    """Be a supervisor until SIGTERM/SIGINT (blocking; this process's signal handlers): reserve
    *host*:*port*, run the workers (``command_for(bound_port, state_dir)`` gives the slots'
    :data:`Command`), write ``{"http": bound_port}`` to *ports_file* once every worker serves,
    forward the signal and drain. 0 when every worker drained and exited cleanly."""
    reserved = reserve_port(host, port)
    bound = int(reserved.getsockname()[1])
    state_dir = tempfile.mkdtemp(prefix=f"{names.metric_prefix.replace('_', '-')}-")
    sup = Supervisor(workers, command_for(bound, state_dir), state_dir, liveness_timeout, names,
                     policy or RestartPolicy(), env=env or {})
    deadline: float | None = None

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal deadline
        if not sup.stopping:
            sup.log.info(f"{names.label} stopping: draining every worker", extra={"signal": signum})
            deadline = time.monotonic() + shutdown_grace + 5.0
        sup.stop(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    written = False
    try:
        while True:
            if not _step(sup):
                break
            if deadline is not None and time.monotonic() > deadline:
                sup.kill_stragglers()
                deadline = None
            if not written and ports_file and sup.all_served():
                write_ports_file(ports_file, {"http": bound})
                sup.log.info(f"{names.label} listening", extra={"address": f"{host}:{bound}", "workers": workers})
                written = True
            time.sleep(0.05)
    finally:
        if not sup.stopping:  # an error in the loop itself: leave no worker behind
            sup.stop(signal.SIGKILL)
        reserved.close()
        shutil.rmtree(state_dir, ignore_errors=True)
    return 0 if drained_cleanly(sup.exit_codes) else 1
