"""``motor-gateway`` with ``workers: N > 1``: N worker processes on one listening port, one
supervising parent.

* **One port.** The parent binds a ``SO_REUSEPORT`` socket (without listening: it only holds
  the port, also while every worker is being restarted); each worker binds its own listening
  socket on the same port and the kernel spreads new connections over the listening ones.
* **Supervised.** A worker that exits is logged and restarted (at once, then with a doubling
  delay while it keeps dying young: ``worker_policy.RestartPolicy``). Each worker touches a
  heartbeat file every second from its event loop; one silent for ``worker_liveness_timeout_sec``
  (a wedged loop: the kernel would still hand it connections) is killed and restarted.
  SIGTERM/SIGINT to the parent go to every worker, which stop listening and drain their requests
  (``shutdown_grace_sec``); the parent exits when they all have.
* **One view.** The workers share a Prometheus multiprocess directory (``prometheus_client``'s
  multiprocess mode): a scrape of ``/metrics``, whichever worker the connection lands on, sums
  the counters and histograms of every worker, past incarnations included, and the in-flight
  gauges of the live ones (``livesum``). The parent adds ``motor_gateway_workers`` (configured,
  running) and ``motor_gateway_worker_restarts_total{reason}`` through a status file the workers'
  collector reads. ``/health`` and ``/ready`` are answered by whichever worker takes the
  connection: every worker dials the same coordinators, and a dead or wedged one is replaced by
  the parent (kept out of the port while it is gone).
* **One front's admission.** Each worker gets its index and the number of workers (kept across
  restarts) and enforces its share of the request-count limits (``worker_policy.admission_share``),
  so the whole front admits at most what ``admission`` says; the byte bounds stay per worker.

Scheduling state is not in the gateway: every worker sends its requests to the one master
coordinator, which owns load, prefix affinity and breakers. So least-load and prefix affinity are
the same whichever worker took a request (tests/gateway/test_workers.py shows it with real
processes).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from motor_common.errors import ConfigError
from motor_common.ports import bind_failure
from motor_common.runner import write_ports_file
from motor_gateway.worker_policy import RestartPolicy, unresponsive

log = logging.getLogger("motor_gateway.workers")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
STATUS_FILE = "supervisor.json"
HEARTBEAT_INTERVAL_SEC = 1.0
# Before its first heartbeat a worker imports, reads its files and binds: allow this much more.
STARTUP_GRACE_SEC = 60.0
RESTART_REASONS = ("exited", "unresponsive")


def beat_path(state_dir: str, index: int) -> Path:
    return Path(state_dir) / f"w{index}.beat"


def beat(state_dir: str, index: int) -> None:
    """The worker's heartbeat (called from its event loop): touch ``w<index>.beat``."""
    path = beat_path(state_dir, index)
    try:
        os.utime(path)
    except FileNotFoundError:
        path.touch()


class _SupervisorCollector:
    """``motor_gateway_workers`` and ``motor_gateway_worker_restarts_total`` from the parent's
    status file (read at each scrape)."""

    def __init__(self, state_dir: str) -> None:
        self.path = Path(state_dir) / STATUS_FILE

    def collect(self) -> Iterable[Metric]:
        try:
            status: dict[str, Any] = orjson.loads(self.path.read_bytes())
        except (OSError, ValueError):
            return []
        workers = GaugeMetricFamily("motor_gateway_workers",
                                    "Gateway worker processes: configured, and running now.", labels=["state"])
        workers.add_metric(["configured"], float(status.get("configured", 0)))
        workers.add_metric(["running"], float(status.get("running", 0)))
        restarts = CounterMetricFamily("motor_gateway_worker_restarts",
                                       "Gateway workers restarted by the supervisor, by reason "
                                       "(exited: the process ended; unresponsive: no heartbeat).",
                                       labels=["reason"])
        counts = status.get("restarts", {})
        for reason in RESTART_REASONS:
            restarts.add_metric([reason], float(counts.get(reason, 0)))
        return [workers, restarts]


def worker_registry(state_dir: str) -> CollectorRegistry:
    """What a worker's ``/metrics`` serves: every worker's metrics (the multiprocess directory
    ``state_dir/metrics``) and the supervisor's."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(Path(state_dir) / "metrics"))  # type: ignore[no-untyped-call]
    registry.register(_SupervisorCollector(state_dir))
    return registry


def _die_with_parent() -> None:
    """Workers get SIGTERM when the supervising process dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


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
    started: float = 0.0  # time.time() of the spawn (compared with heartbeat mtimes)
    restart_at: float = 0.0
    quick_deaths: int = 0
    killed_unresponsive: bool = False
    served: bool = False  # has written its ports file once (this incarnation)


@dataclass
class Supervisor:
    """Runs ``workers`` copies of ``python -m motor_gateway.main <argv>`` on *port*."""

    workers: int
    argv: list[str]
    port: int
    state_dir: str
    liveness_timeout: float
    shutdown_grace: float
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    startup_grace: float = STARTUP_GRACE_SEC
    slots: list[_Slot] = field(init=False)
    restarts: dict[str, int] = field(init=False)
    stopping: bool = False
    exit_codes: list[int] = field(default_factory=list)  # of the workers that ended while stopping

    def __post_init__(self) -> None:
        self.slots = [_Slot(i) for i in range(self.workers)]
        self.restarts = dict.fromkeys(RESTART_REASONS, 0)
        (Path(self.state_dir) / "metrics").mkdir(parents=True, exist_ok=True)

    def _ports_file(self, index: int) -> str:
        return os.path.join(self.state_dir, f"w{index}.json")

    def _spawn(self, slot: _Slot) -> None:
        beat_path(self.state_dir, slot.index).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            os.unlink(self._ports_file(slot.index))
        cmd = [sys.executable, "-m", "motor_gateway.main", *self.argv, "--workers", "1", "--reuse-port",
               "--port", str(self.port), "--ports-file", self._ports_file(slot.index),
               "--worker-dir", self.state_dir, "--worker-index", str(slot.index),
               "--worker-count", str(self.workers)]
        env = {**os.environ, MULTIPROC_ENV: str(Path(self.state_dir) / "metrics")}
        slot.proc = subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent)
        slot.started = time.time()
        slot.killed_unresponsive = False
        slot.served = False
        log.info("gateway worker started", extra={"worker": slot.index, "pid": slot.proc.pid})

    def _write_status(self) -> None:
        running = sum(1 for s in self.slots if s.proc is not None and s.proc.poll() is None)
        write_ports_file(os.path.join(self.state_dir, STATUS_FILE),
                         {"configured": self.workers, "running": running, "restarts": self.restarts})  # type: ignore[dict-item]

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Forward *signum* to every running worker; no restarts from now on."""
        self.stopping = True
        for s in self.slots:
            if s.proc is not None and s.proc.poll() is None:
                s.proc.send_signal(signum)

    def _reap(self, slot: _Slot, code: int, now: float) -> None:
        assert slot.proc is not None
        pid = slot.proc.pid
        mark_process_dead(pid, str(Path(self.state_dir) / "metrics"))  # type: ignore[no-untyped-call]
        slot.proc = None
        if self.stopping:
            self.exit_codes.append(code)
            log.info("gateway worker stopped", extra={"worker": slot.index, "pid": pid, "code": code})
            return
        reason = "unresponsive" if slot.killed_unresponsive else "exited"
        delay, slot.quick_deaths = self.policy.next_delay(now - slot.started, slot.quick_deaths)
        slot.restart_at = now + delay
        self.restarts[reason] += 1
        log.error("gateway worker died; restarting it", extra={
            "worker": slot.index, "pid": pid, "code": code, "reason": reason,
            "uptime_sec": round(now - slot.started, 3), "restart_in_sec": delay})

    def step(self, now: float) -> bool:
        """One pass: reap, kill the unresponsive, restart; False once stopping and all are gone."""
        changed = False
        for slot in self.slots:
            if slot.proc is None:
                if not self.stopping and now >= slot.restart_at:
                    self._spawn(slot)
                    changed = True
                continue
            code = slot.proc.poll()
            if code is not None:
                self._reap(slot, code, now)
                changed = True
                continue
            if not slot.served and os.path.exists(self._ports_file(slot.index)):
                slot.served = True
            if self.stopping or slot.killed_unresponsive:
                continue
            try:
                last: float | None = beat_path(self.state_dir, slot.index).stat().st_mtime
            except FileNotFoundError:
                last = None
            if unresponsive(now, slot.started, last, self.liveness_timeout, self.startup_grace):
                log.error("gateway worker unresponsive (no heartbeat); killing it", extra={
                    "worker": slot.index, "pid": slot.proc.pid, "timeout_sec": self.liveness_timeout})
                slot.killed_unresponsive = True
                slot.proc.kill()
        if changed:
            self._write_status()
        return not (self.stopping and all(s.proc is None for s in self.slots))

    def all_served(self) -> bool:
        return all(s.served for s in self.slots)

    def kill_stragglers(self) -> None:
        for s in self.slots:
            if s.proc is not None and s.proc.poll() is None:
                log.error("gateway worker did not stop within the grace period; killing it",
                          extra={"worker": s.index, "pid": s.proc.pid})
                s.proc.kill()


def supervise(*, workers: int, host: str, port: int, argv: list[str], ports_file: str | None,
              liveness_timeout: float, shutdown_grace: float, policy: RestartPolicy | None = None) -> int:
    """Run the workers until SIGTERM/SIGINT; 0 when every worker drained and exited cleanly."""
    reserved = reserve_port(host, port)
    bound = int(reserved.getsockname()[1])
    state_dir = tempfile.mkdtemp(prefix="motor-gateway-")
    sup = Supervisor(workers, argv, bound, state_dir, liveness_timeout, shutdown_grace,
                     policy or RestartPolicy())
    deadline: float | None = None

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal deadline
        if not sup.stopping:
            log.info("gateway stopping: draining every worker", extra={"signal": signum})
            deadline = time.monotonic() + shutdown_grace + 5.0
        sup.stop(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    written = False
    try:
        while True:
            if not sup.step(time.time()):
                break
            if deadline is not None and time.monotonic() > deadline:
                sup.kill_stragglers()
                deadline = None
            if not written and ports_file and sup.all_served():
                write_ports_file(ports_file, {"http": bound})
                log.info("gateway listening", extra={"address": f"{host}:{bound}", "workers": workers})
                written = True
            time.sleep(0.05)
    finally:
        if not sup.stopping:  # an error in the loop itself: leave no worker behind
            sup.stop(signal.SIGKILL)
        reserved.close()
        shutil.rmtree(state_dir, ignore_errors=True)
    # A worker that failed or had to be killed while draining makes the exit non-zero. One ended
    # by the forwarded signal itself had not installed its handler yet: it was not serving.
    clean = {0, -signal.SIGTERM, -signal.SIGINT}
    return 0 if all(c in clean for c in sup.exit_codes) else 1
