"""A master resigning (graceful stop) reads as isolated from the moment it sends the revocation.

Real etcd; two ``EtcdElection`` candidates, the resigning one behind a TCP proxy that can hold back
etcd's replies. etcd applies the revocation (the lock is free, the standby takes it at its next
check) while its reply is still on the way, or lost: before the fix the resigning master went on
reading as a serving master until the reply came or the call timed out (up to ``call_timeout``),
and for that time two masters served.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from motor_common.etcd_election import EtcdElection
from motor_common.leadership import LeaderRole
from tests.etcd_server import etcd_server
from tests.helpers import wait_for

pytestmark = [pytest.mark.etcd, pytest.mark.slow, pytest.mark.timeout(60)]

KEY = "/motor/resign-window/leader"


class ReplyHoldingProxy:
    """127.0.0.1 TCP proxy to *port*; while ``held`` is set, bytes from the server are kept back."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.held = False
        self._released = asyncio.Event()
        self._released.set()
        self._writers: list[asyncio.StreamWriter] = []

    def hold(self) -> None:
        self.held = True
        self._released.clear()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.endpoint = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self._writers += [writer, up_writer]
        await asyncio.gather(self._pipe(reader, up_writer, False), self._pipe(up_reader, writer, True))

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, from_server: bool) -> None:
        try:
            while data := await src.read(65536):
                if from_server:
                    await self._released.wait()
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            dst.close()

    async def close(self) -> None:
        self._server.close()
        for w in self._writers:
            w.close()
        self._released.set()
        await self._server.wait_closed()


async def test_a_resigning_master_is_isolated_before_its_revocation_is_answered() -> None:
    async with etcd_server() as etcd:
        proxy = ReplyHoldingProxy(int(etcd.endpoint.rsplit(":", 1)[1]))
        await proxy.start()
        a = EtcdElection([proxy.endpoint], KEY, "a", ttl=3, check_interval=0.1, call_timeout=1.0)
        b = EtcdElection([etcd.endpoint], KEY, "b", ttl=3, check_interval=0.1, call_timeout=1.0)
        stopping: asyncio.Task[None] | None = None
        try:
            await a.start()
            await wait_for(lambda: a.current().serving, timeout=10, what="a serving master")
            await b.start()
            await wait_for(lambda: b.view.holder == "a", timeout=10, what="b seeing a as master")
            # Just after a renewal: a's own validity bound is ~2 s away, longer than the revoke's
            # 1 s timeout (so only the fix can make a read as isolated while the reply is held).
            renewed = a.valid_until
            await wait_for(lambda: a.valid_until != renewed, timeout=5, what="a renewing")
            proxy.hold()
            stopping = asyncio.create_task(a.stop())
            await wait_for(lambda: b.current().serving, timeout=5, what="b serving master")
            assert not stopping.done()  # a's revocation is still waiting for its reply
            assert a.view.role is LeaderRole.MASTER
            # At most one serving master: a, still master in its own view, reads as isolated.
            assert not a.current().serving, a.current()
            await stopping
            assert a.view.role is LeaderRole.STANDBY
        finally:
            if stopping is not None:
                with contextlib.suppress(Exception):
                    await stopping
            await a.stop(resign=False)
            await b.stop()
            await proxy.close()
