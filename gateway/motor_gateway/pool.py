"""Coordinators the gateway talks to: one long-lived channel each; the routing rule picks one.

With one address the pool is just that channel (no probing). With several (active/standby
coordinators) one probe loop per coordinator asks it for its readiness every ``probe_interval``
seconds (each call bounded by ``probe_timeout``, so a frozen coordinator reads as unreachable
quickly, and never delays the others' results); every result re-runs
``motor_gateway.routing.choose`` over the latest views. A failed
dispatch triggers an immediate probe (:meth:`CoordinatorPool.kick`) but never changes the route
by itself, so one bad request cannot make the pool flap.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_client import call_metadata, open_channel
from motor_common.leadership import LeaderRole
from motor_common.openai_front.dispatch import Readiness
from motor_common.tasks import TaskOwner
from motor_common.tls import TlsConfig
from motor_gateway.mux import DispatchMux
from motor_gateway.routing import UNREACHABLE, CoordinatorView, Route, choose

__all__ = ["UNREACHABLE", "CoordinatorPool"]

log = logging.getLogger(__name__)

_ROLES = {
    cpb.COORDINATOR_ROLE_STANDALONE: LeaderRole.STANDALONE,
    cpb.COORDINATOR_ROLE_MASTER: LeaderRole.MASTER,
    cpb.COORDINATOR_ROLE_STANDBY: LeaderRole.STANDBY,
}


class _Member:
    def __init__(self, address: str, tls: TlsConfig | None, tls_ca_file: str | None) -> None:
        self.address = address
        self.channel = open_channel(address, tls=tls, tls_ca_file=tls_ca_file)
        self.stub = cgrpc.DispatchServiceStub(self.channel)
        self.mux = DispatchMux(self.stub, address, self.channel)
        self._refused: str | None = None  # the last refusal logged (once per change, not per probe)

    async def view(self, timeout: float) -> CoordinatorView:
        try:
            resp = await self.stub.GetReadiness(
                cpb.GetReadinessRequest(), timeout=timeout, metadata=call_metadata()
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return CoordinatorView(self.address, reachable=False)
            # The coordinator's own words go to the log, not into the reason /ready shows.
            if exc.details() != self._refused:
                self._refused = exc.details()
                log.warning("coordinator refused the readiness probe", extra={
                    "coordinator": self.address, "code": exc.code().name, "detail": exc.details()})
            return CoordinatorView(self.address, reachable=False, reason=f"{UNREACHABLE}: {exc.code().name}")
        self._refused = None
        return CoordinatorView(
            self.address, reachable=True, ready=resp.ready,
            reason="ok" if resp.ready else (resp.reason or "not ready"),
            role=_ROLES.get(resp.role), isolated=resp.isolated,
            # Coordinators older than the field report it unset (false): treat unknown as available.
            store_available=resp.store_available or resp.role in (
                cpb.COORDINATOR_ROLE_UNSPECIFIED, cpb.COORDINATOR_ROLE_STANDALONE),
        )


class CoordinatorPool:
    def __init__(
        self,
        addresses: tuple[str, ...] | list[str],
        *,
        tls: TlsConfig | None = None,
        tls_ca_file: str | None = None,
        timeout: float = 3.0,
        probe_interval: float = 0.25,
        probe_timeout: float = 0.5,
        failover_timeout: float = 10.0,
        dispatch_attempts: int = 3,
        multiplex: bool = True,
    ) -> None:
        if not addresses:
            raise ValueError("CoordinatorPool needs at least one address")
        self._members = {a: _Member(a, tls, tls_ca_file) for a in addresses}
        for member in self._members.values():
            member.mux.supported = multiplex
        self._order = list(self._members)
        self._timeout = timeout
        self._probe_interval = probe_interval
        self._probe_timeout = min(probe_timeout, timeout)
        # How long a request waits for a master to appear (failover in progress), and how many
        # times one request may be sent (the first try included) when it failed before its head.
        self.failover_timeout = failover_timeout
        self.dispatch_attempts = max(1, dispatch_attempts)
        single = self._order[0] if len(self._order) == 1 else None
        self._route = Route(single, ready=True) if single else Route(None, reason="not probed yet")
        self._views: dict[str, CoordinatorView] = {}
        self._changed = asyncio.Event()
        self._kicks = {a: asyncio.Event() for a in self._order}
        self._probing = False
        self._tasks = TaskOwner("coordinator-pool")

    # -- the route -------------------------------------------------------------------------------

    @property
    def addresses(self) -> list[str]:
        return list(self._order)

    @property
    def single(self) -> bool:
        return len(self._order) == 1

    @property
    def route(self) -> Route:
        return self._route

    @property
    def current(self) -> str:
        return self._route.address or self._order[0]

    def stub(self, address: str | None = None) -> cgrpc.DispatchServiceStub:
        """The DispatchService stub of *address*, else of the routed (or first) coordinator."""
        return self._members[address or self.current].stub

    def mux(self, address: str) -> DispatchMux:
        """The DispatchMany stream to *address*."""
        return self._members[address].mux

    def changed(self) -> asyncio.Event:
        """An event set at the next route change (take it before awaiting)."""
        return self._changed

    def kick(self) -> None:
        """Probe now (a dispatch failed): the route is re-decided without waiting a full interval."""
        for event in self._kicks.values():
            event.set()

    async def wait_route(self, deadline: float, *, avoid: str | None = None) -> Route:
        """The route once it names a coordinator (other than *avoid*, if given), or the last
        route (address None) when the monotonic *deadline* passes."""
        while True:
            route = self._route
            if route.address is not None and route.address != avoid:
                return route
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.single:
                return route
            changed = self._changed
            self.kick()
            try:
                async with asyncio.timeout(remaining):
                    await changed.wait()
            except TimeoutError:
                return self._route

    async def wait_ready(self, deadline: float) -> Route:
        """The route once it names a *ready* coordinator, or the last route when the monotonic
        *deadline* passes (a coordinator that just took over may not have its instance set yet)."""
        while True:
            route = self._route
            remaining = deadline - time.monotonic()
            if (route.address is not None and route.ready) or remaining <= 0 or self.single:
                return route
            changed = self._changed
            self.kick()
            try:
                async with asyncio.timeout(min(remaining, self._probe_interval)):
                    await changed.wait()
            except TimeoutError:
                pass

    def _set(self, views: list[CoordinatorView]) -> None:
        self._views.update((v.address, v) for v in views)
        if len(self._views) < len(self._order):
            return  # not every coordinator probed yet: no decision on partial knowledge
        new = choose([self._views[a] for a in self._order], self._route.address)
        old, self._route = self._route, new
        moved = (new.address, new.degraded) != (old.address, old.degraded)
        if moved:
            log.warning("coordinator route changed", extra={
                "old": old.address, "new": new.address, "degraded": new.degraded, "reason": new.reason})
        if moved or new.ready != old.ready:  # waiters for a ready route wake too (wait_ready)
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()

    # -- probing ---------------------------------------------------------------------------------

    async def refresh(self) -> Route:
        views = await asyncio.gather(*(self._members[a].view(self._probe_timeout) for a in self._order))
        if not self.single:
            self._set(list(views))
        return self._route

    def start(self) -> None:
        if not self.single:
            self._probing = True
            for address in self._order:
                self._tasks.spawn(self._probe_loop(address), name=f"coordinator-probe-{address}")

    async def _probe_loop(self, address: str) -> None:
        member, kick = self._members[address], self._kicks[address]
        while True:
            kick.clear()
            self._set([await member.view(self._probe_timeout)])
            try:
                async with asyncio.timeout(self._probe_interval):
                    await kick.wait()
            except TimeoutError:
                pass

    async def readiness(self) -> Readiness:
        """For ``/health``: ready when there is a route to a ready (or degraded) coordinator."""
        if self.single:
            address = self._order[0]
            v = await self._members[address].view(self._timeout)
            return Readiness(v.ready, v.reason, address)
        if not self._probing or not self._views:
            await self.refresh()
        route = self._route
        return Readiness(route.ready, route.reason or "ok", route.address or "")

    async def close(self) -> None:
        await self._tasks.close()
        await asyncio.gather(*(m.mux.close() for m in self._members.values()), return_exceptions=True)
        await asyncio.gather(*(m.channel.close() for m in self._members.values()), return_exceptions=True)
