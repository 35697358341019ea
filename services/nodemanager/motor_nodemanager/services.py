"""The service registry: what a node runs, and the KV-cache store worker.

Two service kinds are registered in :data:`SERVICES`: ``engine`` (the engine processes, owned by
:class:`~motor_nodemanager.engines.EngineSupervisor`) and ``kv-cache-store`` (one worker process
launched from ``kv_cache_store_config.command``, owned by :class:`KvStoreWorker`). A node's services
follow from its configuration (:func:`plan_services`, pure):

=============================  ==================================  =============================
``kv_cache_store_config``      services (start order)              registration / heartbeat
=============================  ==================================  =============================
``enable: false``              engine                              yes
``enable: true, combined``     kv-cache-store, engine              yes
``enable: true, separated``    kv-cache-store                      no
=============================  ==================================  =============================

The KV store starts before the engines (they connect to it) and stops after them. An engine relaunch
(``RestartEngine``) touches only the engine service: the KV store keeps its process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import IO

from motor_common.errors import Internal
from motor_common.procs import die_with_parent
from motor_nodemanager.config import KvCacheStoreConfig
from motor_nodemanager.engines import wait_exit

log = logging.getLogger(__name__)

ENGINE = "engine"
KV_CACHE_STORE = "kv-cache-store"
SERVICES = (KV_CACHE_STORE, ENGINE)  # registry, in start order


def plan_services(kv: KvCacheStoreConfig) -> tuple[str, ...]:
    """The services of a node, in start order (stopped in reverse)."""
    if not kv.enable:
        return (ENGINE,)
    if kv.mode == "separated":
        return (KV_CACHE_STORE,)
    return (KV_CACHE_STORE, ENGINE)


class KvStoreWorker:
    """One KV-cache store process in its own session (stopped as a process group, like engines)."""

    def __init__(self, cfg: KvCacheStoreConfig, host: str = "127.0.0.1") -> None:
        self.cfg = cfg
        self.host = host
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else 0

    async def start(self) -> int:
        return self._spawn()

    def _spawn(self) -> int:
        argv = list(self.cfg.command or ())
        if not argv:
            raise Internal("kv_cache_store_config.command is empty", reason="KV_STORE_NO_COMMAND")
        env = {**os.environ, **self.cfg.env, "MOTOR_KV_STORE_BACKEND": self.cfg.backend}
        if self.cfg.port:
            env["MOTOR_KV_STORE_PORT"] = str(self.cfg.port)
        if self.cfg.log_dir:
            Path(self.cfg.log_dir).mkdir(parents=True, exist_ok=True)
            self._log = open(
                Path(self.cfg.log_dir) / "kv-cache-store.log", "ab"
            )  # closed in stop()
        try:
            self.proc = subprocess.Popen(
                die_with_parent(argv),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT if self._log is not None else None,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise Internal(f"Failed to start KV cache store: {argv[0]}: {exc.strerror or exc}",
                           reason="KV_STORE_SPAWN_FAILED") from exc  # fmt: skip
        log.info("KV cache store started", extra={"pid": self.proc.pid, "backend": self.cfg.backend,
                                                  "argv": " ".join(argv)})  # fmt: skip
        return self.proc.pid

    def healthy(self) -> tuple[bool, str]:
        """Process alive and, with a port configured, accepting connections."""
        if self.proc is None:
            return False, "KV cache store not started"
        rc = self.proc.poll()
        if rc is not None:
            return False, f"KV cache store exited with {rc}"
        if self.cfg.port:
            try:
                with socket.create_connection((self.host, self.cfg.port), timeout=0.5):
                    pass
            except OSError:
                return False, f"KV cache store not accepting on port {self.cfg.port}"
        return True, "KV cache store running"

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.cfg.stop_timeout_sec):
                    await wait_exit(proc)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            log.info(
                "KV cache store stopped", extra={"pid": proc.pid, "returncode": proc.returncode}
            )
        if self._log is not None:
            self._log.close()
            self._log = None
