"""Coordinators the gateway talks to: one long-lived channel each, the first ready one serves.

With one address the pool is just that channel. With several (active/standby coordinators) a
background probe asks each for its readiness every ``probe_interval`` seconds, in order, and the
first ready one becomes the preferred target; a failed dispatch does not change the choice by
itself (the next probe does), so the pool never flaps on one bad request.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import grpc

from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_client import call_metadata, open_channel
from motor_common.tasks import TaskOwner

log = logging.getLogger(__name__)

UNREACHABLE = "coordinator unreachable"


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str
    address: str


class _Member:
    def __init__(self, address: str, tls_ca_file: str | None) -> None:
        self.address = address
        self.channel = open_channel(address, tls_ca_file=tls_ca_file)
        self.stub = cgrpc.DispatchServiceStub(self.channel)  # type: ignore[no-untyped-call]

    async def readiness(self, timeout: float) -> Readiness:
        try:
            resp = await self.stub.GetReadiness(
                cpb.GetReadinessRequest(), timeout=timeout, metadata=call_metadata()
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return Readiness(False, UNREACHABLE, self.address)
            return Readiness(False, f"{UNREACHABLE}: {exc.code().name}: {exc.details()}", self.address)
        reason = "ok" if resp.ready else (resp.reason or "not ready")
        return Readiness(resp.ready, reason, self.address)


class CoordinatorPool:
    def __init__(
        self,
        addresses: tuple[str, ...] | list[str],
        *,
        tls_ca_file: str | None = None,
        timeout: float = 3.0,
        probe_interval: float = 2.0,
    ) -> None:
        if not addresses:
            raise ValueError("CoordinatorPool needs at least one address")
        self._members = [_Member(a, tls_ca_file) for a in addresses]
        self._preferred = 0
        self._timeout = timeout
        self._probe_interval = probe_interval
        self._tasks = TaskOwner("coordinator-pool")

    @property
    def addresses(self) -> list[str]:
        return [m.address for m in self._members]

    @property
    def current(self) -> str:
        return self._members[self._preferred].address

    def stub(self) -> cgrpc.DispatchServiceStub:
        """The DispatchService stub of the preferred coordinator."""
        return self._members[self._preferred].stub

    def start(self) -> None:
        if len(self._members) > 1:
            self._tasks.spawn(self._probe_loop(), name="coordinator-probe")

    async def readiness(self) -> Readiness:
        """Readiness of the first ready coordinator, else the preferred one's reason."""
        first: Readiness | None = None
        for index, member in enumerate(self._members):
            state = await member.readiness(self._timeout)
            if state.ready:
                self._preferred = index
                return state
            first = first or state
        assert first is not None
        return first

    async def _probe_loop(self) -> None:
        while True:
            before = self.current
            await self.readiness()
            if self.current != before:
                log.warning("switched coordinator", extra={"old": before, "new": self.current})
            await asyncio.sleep(self._probe_interval)

    async def close(self) -> None:
        await self._tasks.close()
        await asyncio.gather(*(m.channel.close() for m in self._members), return_exceptions=True)
