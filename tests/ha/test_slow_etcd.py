"""A master behind a slow etcd stays ready while every call is answered inside its timeout.

Real etcd behind a TCP proxy that delays each of etcd's replies by 0.4 s (a loaded etcd, a slow
disk, a long round trip); the election's call timeout is 1 s. A renewal is two calls (refresh, then
read the key) and the master's validity counts from the refresh's send. Renewals were spaced ttl/3
after the previous one *ended*: the validity lapsed before the next one confirmed the lease, and
the master read as isolated (unready, refusing Dispatch) for ~40 % of the time, every cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from motor_common.etcd_election import EtcdElection
from motor_common.leadership import LeaderRole
from tests.etcd_server import etcd_server
from tests.helpers import wait_for

pytestmark = [pytest.mark.etcd, pytest.mark.slow, pytest.mark.timeout(60)]

DELAY = 0.4


class LatencyProxy:
    """127.0.0.1 TCP proxy to *port* delivering the server's bytes *delay* seconds late (in order)."""

    def __init__(self, port: int, delay: float) -> None:
        self.port = port
        self.delay = delay
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.endpoint = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
            await asyncio.gather(self._pipe(reader, up_writer, 0.0), self._pipe(up_reader, writer, self.delay))
        except asyncio.CancelledError:  # close(): a handler task that ends cancelled is logged by asyncio
            writer.close()
        finally:
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, delay: float) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    return
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                dst.write(data)
                await dst.drain()

        out = asyncio.create_task(deliver())
        try:
            while data := await src.read(65536):
                queue.put_nowait((time.monotonic() + delay, data))
            queue.put_nowait((0.0, b""))
            await out
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            out.cancel()
            dst.close()

    async def close(self) -> None:
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._server.wait_closed()


async def test_a_master_behind_a_slow_etcd_stays_ready() -> None:
    async with etcd_server() as etcd:
        proxy = LatencyProxy(int(etcd.endpoint.rsplit(":", 1)[1]), DELAY)
        await proxy.start()
        a = EtcdElection([proxy.endpoint], "/motor/slow-etcd/leader", "a", ttl=3, check_interval=0.5,
                         call_timeout=1.0)
        try:
            await a.start()
            await wait_for(lambda: a.current().serving, timeout=20, what="a serving master")
            # Three lease TTLs: several renewals, each two calls answered 0.4 s late.
            samples: list[bool] = []
            end = time.monotonic() + 9
            while time.monotonic() < end:
                samples.append(a.current().serving)
                await asyncio.sleep(0.02)
            assert a.view.role is LeaderRole.MASTER
            unready = samples.count(False)
            assert unready == 0, f"the master read as unready in {unready} of {len(samples)} samples"
        finally:
            await a.stop()
            await proxy.close()
