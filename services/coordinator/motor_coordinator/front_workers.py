"""The coordinator's co-located front as N worker processes (``http.workers`` > 1).

The coordinator reserves ``http.port`` (a ``SO_REUSEPORT`` socket bound, not listening, so the
port stays taken while workers restart), serves ``FrontWorkerService`` on a unix socket in a
private directory (mode 0700), creates the load board there (``load_board.py``) and starts
``python -m motor_coordinator.front_worker`` once per slot under
``motor_common.worker_supervisor``: a worker that exits or stops sending heartbeats is restarted;
SIGTERM drains every worker. The workers share a Prometheus multiprocess directory, so
the front's ``/metrics`` (whichever worker answers) has every worker's request metrics, plus
``motor_coordinator_front_workers`` and ``motor_coordinator_front_worker_restarts_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import orjson

from motor_common.config import to_dict
from motor_common.errors import ConfigError
from motor_common.tasks import TaskOwner
from motor_common.worker_supervisor import (
    STARTUP_GRACE_SEC,
    Supervisor,
    WorkerNames,
    drained_cleanly,
    reserve_port,
    run,
    shutdown,
)
from motor_coordinator.config import CoordinatorConfig
from motor_coordinator.front_sync import FrontSync, FrontSyncServer
from motor_coordinator.load_board import LoadBoard

log = logging.getLogger("motor_coordinator.front_workers")

WORKER_NAMES = WorkerNames(label="coordinator front", metric_prefix="motor_coordinator_front",
                           logger="motor_coordinator.front_workers")


class FrontWorkers:
    def __init__(self, cfg: CoordinatorConfig, sync: FrontSync, *, startup_timeout: float = STARTUP_GRACE_SEC) -> None:
        self.cfg = cfg
        self.sync = sync
        self.coordinator_address = ""
        self.startup_timeout = startup_timeout
        self.port: int | None = None
        self.supervisor: Supervisor | None = None
        self._dir: str = tempfile.mkdtemp(prefix="motor-coordinator-front-")  # mode 0700
        # The workers' load, read by this process too (its Dispatch and /metrics count the front's).
        self.board = LoadBoard.create(str(Path(self._dir) / "load.board"), cfg.http.workers)
        sync.on_worker_gone = self.board.clear_row
        self._server: FrontSyncServer | None = None
        self._stop = asyncio.Event()
        self._tasks = TaskOwner("front-workers")
        self._reserved: socket.socket | None = None

    def _command(self, index: int, ports_file: str) -> list[str]:
        assert self._server is not None and self.port is not None
        return [sys.executable, "-m", "motor_coordinator.front_worker",
                "--config-json", str(Path(self._dir) / "config.json"), "--sync", self._server.target,
                "--board", self.board.path,
                "--port", str(self.port), "--ports-file", ports_file, "--worker-dir", self._dir,
                "--worker-index", str(index), "--worker-count", str(self.cfg.http.workers),
                "--coordinator-address", self.coordinator_address]

    async def start(self, coordinator_address: str) -> int:
        """Reserve the port, serve the sync socket, start the workers; return the port once every
        worker serves. ``ConfigError`` when the port is taken or a worker never comes up."""
        h = self.cfg.http
        assert h.port is not None
        reserved = reserve_port(h.host, h.port)  # ConfigError: busy
        self._reserved = reserved
        self.port = int(reserved.getsockname()[1])
        self.coordinator_address = coordinator_address
        (Path(self._dir) / "config.json").write_bytes(orjson.dumps(to_dict(self.cfg)))
        self._server = FrontSyncServer(self.sync, self._dir)
        await self._server.start()
        sup = self.supervisor = Supervisor(workers=h.workers, command=self._command, state_dir=self._dir,
                                           liveness_timeout=h.worker_liveness_timeout_sec, names=WORKER_NAMES)
        served = asyncio.Event()
        self._tasks.spawn(run(sup, self._stop, on_served=served.set), name="front-supervisor")
        try:
            async with asyncio.timeout(self.startup_timeout):
                await served.wait()
        except TimeoutError:
            raise ConfigError(f"the co-located front's {h.workers} worker processes did not all start within "
                              f"{self.startup_timeout:g}s; their log lines say why") from None
        log.info("co-located front workers serving", extra={"workers": h.workers, "http_port": self.port})
        return self.port

    async def stop(self) -> None:
        self._stop.set()
        await self._tasks.close()
        if self.supervisor is not None:
            codes = await shutdown(self.supervisor, self.cfg.http.shutdown_grace_sec + 5.0)
            if not drained_cleanly(codes):
                log.error("a co-located front worker did not stop cleanly", extra={"exit_codes": codes})
        if self._server is not None:
            await self._server.stop()
        if self._reserved is not None:
            with contextlib.suppress(OSError):
                self._reserved.close()
        self.board.close()
        shutil.rmtree(self._dir, ignore_errors=True)
