"""A nodemanager behind one controller address (Kubernetes ``motor-controller`` Service) follows an
HA failover: the demoted controller stays up and refuses with UNAVAILABLE ``NOT_MASTER`` on the
connection the node already has, and only a *new* connection reaches the new master.

The Service is emulated by a TCP proxy that, like kube-proxy, picks the backend once per new
connection; both controllers run on the real gRPC chassis; the node side is the real
``GrpcController`` and ``HeartbeatSender``."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest

from motor_common.errors import InvalidArgument, Unavailable
from motor_common.gen.motor.controller.v1 import controller_pb2 as cpb
from motor_nodemanager.controller_client import (
    FaultLevel,
    FaultReport,
    FaultSource,
    GrpcController,
    HeartbeatFrame,
    NodeState,
)
from motor_nodemanager.controller_reopen import (
    REOPEN_AFTER_FAILURES,
    REOPEN_BASE_SEC,
    REOPEN_CAP_SEC,
    ReopenPolicy,
)
from motor_nodemanager.heartbeat import HeartbeatSender
from tests.helpers import wait_for
from tests.nodemanager.fake_controller import FakeController, serve_fake_controller

KEY = "reopen-key"


# --- the decision (pure) --------------------------------------------------------------------------
def test_not_master_reopens_at_once_then_with_a_growing_backoff() -> None:
    p = ReopenPolicy()
    assert p.failed("NOT_MASTER", now=100.0)
    assert not p.failed("NOT_MASTER", now=100.0 + REOPEN_BASE_SEC / 2)  # within the back-off
    assert p.failed("NOT_MASTER", now=100.0 + REOPEN_BASE_SEC)
    t, gaps = 100.0 + REOPEN_BASE_SEC, []
    for _ in range(6):
        gap = p.backoff()
        gaps.append(gap)
        t += gap
        assert p.failed("NOT_MASTER", now=t)
    assert gaps == [2 * REOPEN_BASE_SEC, 4 * REOPEN_BASE_SEC, 8 * REOPEN_BASE_SEC] + [REOPEN_CAP_SEC] * 3


def test_other_peer_failures_reopen_only_when_repeated() -> None:
    p = ReopenPolicy()
    results = [p.failed("UNAVAILABLE", now=float(i)) for i in range(REOPEN_AFTER_FAILURES)]
    assert results == [False] * (REOPEN_AFTER_FAILURES - 1) + [True]


def test_a_success_resets_the_backoff_and_our_own_reopen_is_not_counted() -> None:
    p = ReopenPolicy()
    assert p.failed("NOT_MASTER", now=0.0) and p.failed("NOT_MASTER", now=REOPEN_BASE_SEC)
    p.succeeded()
    assert p.backoff() == 0.0 and p.failed("NOT_MASTER", now=REOPEN_BASE_SEC + 0.01)
    q = ReopenPolicy()
    for _ in range(10):
        assert not q.failed("CONNECTION_REOPENED", now=0.0)
    assert q.failures == 0 and q.last_reopen == -math.inf


# --- real servers behind a Service-like proxy -----------------------------------------------------
class HaController(FakeController):
    """Refuses every call with UNAVAILABLE ``NOT_MASTER`` while it is not master, as a demoted
    HA controller does (its process stays up); mid-stream too."""

    def __init__(self) -> None:
        super().__init__()
        self.master = False
        self.refused = 0
        self.invalid = False  # refuse fault reports INVALID_ARGUMENT

    def gate(self) -> None:
        if not self.master:
            self.refused += 1
            raise Unavailable("controller is not master", reason="NOT_MASTER")

    async def RegisterNode(self, request: cpb.RegisterNodeRequest, context: Any) -> cpb.RegisterNodeResponse:
        self.gate()
        return await super().RegisterNode(request, context)

    async def Heartbeat(
        self, request_iterator: AsyncIterator[cpb.HeartbeatRequest], context: Any
    ) -> AsyncIterator[cpb.HeartbeatResponse]:
        self.gate()
        async for frame in request_iterator:
            self.gate()
            self.frames.append(frame)
            yield cpb.HeartbeatResponse(acked_sequence=frame.sequence, command=cpb.HEARTBEAT_COMMAND_NONE)

    async def ReportFault(self, request: cpb.ReportFaultRequest, context: Any) -> cpb.ReportFaultResponse:
        self.gate()
        if self.invalid:
            raise InvalidArgument("bad report", reason="INVALID_FAULT")
        return await super().ReportFault(request, context)


class ServiceProxy:
    """One address in front of several backends; the backend is chosen when a TCP connection is
    opened and kept for its whole life (kube-proxy's conntrack)."""

    def __init__(self, backend: int) -> None:
        self.backend = backend
        self.connections: list[int] = []  # the backend port of every connection accepted
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = self.backend
        self.connections.append(port)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        self._writers += [writer, up_writer]
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
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
        await self._server.wait_closed()


@pytest.fixture
async def failover() -> AsyncIterator[tuple[ServiceProxy, HaController, int, HaController, int]]:
    old_server, old = await serve_fake_controller(key=KEY, impl=HaController())
    new_server, new = await serve_fake_controller(key=KEY, impl=HaController())
    old.master = True
    proxy = ServiceProxy(old_server.port)
    await proxy.start()
    yield proxy, old, old_server.port, new, new_server.port
    await proxy.close()
    await old_server.stop(0)
    await new_server.stop(0)


def demote(proxy: ServiceProxy, old: HaController, new: HaController, new_port: int) -> None:
    """The election moved: the old controller stays up as a standby, the Service lists the new one."""
    old.master, new.master = False, True
    proxy.backend = new_port


def report() -> FaultReport:
    return FaultReport("node-1", 7, 0, FaultLevel.ENGINE_DEAD, FaultSource.PROCESS_EXIT, pid=42, detail="exit 1")


async def test_heartbeats_reach_the_new_master_behind_one_service_address(
    failover: tuple[ServiceProxy, HaController, int, HaController, int],
) -> None:
    proxy, old, old_port, new, new_port = failover
    peer = GrpcController(proxy.address, KEY)

    async def reregister() -> None:
        return None

    sender = HeartbeatSender(peer, lambda: HeartbeatFrame("node-1", NodeState.RUNNING, 7, ()), lambda: 0.1, reregister)
    task = asyncio.create_task(sender.run())
    try:
        await wait_for(lambda: len(old.frames) >= 2, timeout=10, what="heartbeats at the first master")
        demote(proxy, old, new, new_port)
        await wait_for(lambda: len(new.frames) >= 2, timeout=10, what="heartbeats at the new master")
        assert old.refused >= 1  # the stream on the pinned connection was refused first
        assert proxy.connections[0] == old_port and new_port in proxy.connections
        assert peer.reopened >= 1
        assert sender.connected
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await peer.close()


async def test_a_fault_report_refused_not_master_is_accepted_by_the_new_master_on_the_next_try(
    failover: tuple[ServiceProxy, HaController, int, HaController, int],
) -> None:
    proxy, old, _, new, new_port = failover
    peer = GrpcController(proxy.address, KEY)
    try:
        assert (await peer.report_fault(report(), timeout=5)).accepted  # connection opened to the old master
        demote(proxy, old, new, new_port)
        with pytest.raises(Unavailable) as refused:
            await peer.report_fault(report(), timeout=5)  # the pinned connection: refused
        assert refused.value.reason == "NOT_MASTER"
        assert (await peer.report_fault(report(), timeout=5)).accepted  # a new connection: the new master
        assert [f.pid for f in new.faults] == [42] and len(old.faults) == 1
        assert proxy.connections[-1] == new_port
    finally:
        await peer.close()


async def test_a_refused_argument_does_not_reopen_the_connection(
    failover: tuple[ServiceProxy, HaController, int, HaController, int],
) -> None:
    proxy, old, _, _, _ = failover
    old.invalid = True
    peer = GrpcController(proxy.address, KEY)
    try:
        for _ in range(REOPEN_AFTER_FAILURES + 1):
            with pytest.raises(InvalidArgument):
                await peer.report_fault(report(), timeout=5)
        assert peer.reopened == 0 and len(proxy.connections) == 1
    finally:
        await peer.close()
