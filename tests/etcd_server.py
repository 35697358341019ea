"""A real etcd server on 127.0.0.1 for tests (Debian's etcd-server; installed by scripts/setup --tools)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp

from tests.helpers import free_port, wait_for


@dataclass
class EtcdServer:
    client_port: int
    peer_port: int
    data_dir: str
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self) -> None:
        etcd = shutil.which("etcd") or "/usr/bin/etcd"
        self.proc = subprocess.Popen(
            [
                etcd,
                "--name", "motor-test",
                "--data-dir", self.data_dir,
                "--listen-client-urls", f"http://127.0.0.1:{self.client_port}",
                "--advertise-client-urls", f"http://127.0.0.1:{self.client_port}",
                "--listen-peer-urls", f"http://127.0.0.1:{self.peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_port}",
                "--initial-cluster", f"motor-test=http://127.0.0.1:{self.peer_port}",
                "--log-level", "error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    async def wait_healthy(self, timeout: float = 20.0) -> None:
        async def healthy() -> bool:
            async with aiohttp.ClientSession() as s, s.get(
                f"http://{self.endpoint}/health", timeout=aiohttp.ClientTimeout(total=1)
            ) as r:
                return r.status == 200 and (await r.json(content_type=None)).get("health") == "true"

        await wait_for(healthy, timeout=timeout, what="etcd healthy")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None


@asynccontextmanager
async def etcd_server() -> AsyncIterator[EtcdServer]:
    data_dir = tempfile.mkdtemp(prefix="motor-etcd-")
    server = EtcdServer(free_port(), free_port(), data_dir)
    server.start()
    try:
        await server.wait_healthy()
        yield server
    finally:
        server.kill()
        await asyncio.to_thread(shutil.rmtree, data_dir, True)
