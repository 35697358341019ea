"""Leader election through an etcd lease + lock key (aetcd client).

The candidate that creates ``key`` (compare ``create_revision == 0``) under its own lease is
master; it refreshes the lease every ``ttl / 3``. A standby reads the key every
``check_interval`` and only when it is absent grants a lease and tries the transaction.
Every etcd call has a timeout. State changes go through the pure ``motor_common.leadership``
functions and are published to ``on_change``.

Safety margin: etcd expires the lease no earlier than ``ttl`` after the last refresh was *sent*;
the master considers itself valid only until ``sent + 2/3 ttl`` (:meth:`EtcdElection.current`),
so a master frozen past its lease (SIGSTOP, starved loop) reads as isolated the instant it resumes,
before the standby that took over could overlap with it.

A master that holds the lock but cannot act (its ``on_change`` raised :class:`StepDown`: say, the
state it must load is unreadable to this version) revokes its lease at once, so another candidate
can take over instead of waiting for a master that never acts; it goes on campaigning, and
``may_acquire`` decides when it takes a free lock again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from motor_common import leadership as lship
from motor_common.leadership import LeaderRole, Leadership

log = logging.getLogger(__name__)

OnChange = Callable[[Leadership], Awaitable[None] | None]


class StepDown(Exception):
    """Raised by ``on_change`` when this candidate was made master but cannot act: the election
    revokes its lease (the lock is free for another candidate) and publishes the lost view."""


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.replace("http://", "").rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port or 2379)


class EtcdElection:
    def __init__(
        self,
        endpoints: list[str],
        key: str,
        candidate: str,
        *,
        ttl: float,
        check_interval: float,
        on_change: OnChange | None = None,
        call_timeout: float = 1.0,
        may_acquire: Callable[[], str | None] | None = None,
        on_validity: Callable[[], None] | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("etcd election needs at least one endpoint")
        self.endpoints = endpoints
        self.key = key.encode()
        self.candidate = candidate
        self.ttl, self.check_interval, notes = lship.clamp(ttl, check_interval)
        for note in notes:
            log.warning(note)
        self.call_timeout = min(call_timeout, self.ttl / 3)
        self._on_change = on_change
        # Called whenever valid_until moved with the view unchanged (a renewal; a master resigning
        # or stepping down, before it revokes): what mirrors the bound elsewhere must learn it.
        self._on_validity = on_validity
        # Asked before taking a free lock: None = go ahead, else why this candidate holds back
        # (it only observes; it keeps asking every check interval).
        self._may_acquire = may_acquire
        self._holding_back = ""
        self.view: Leadership = lship.initial_candidate()
        self._client: Any = None
        self._lease: Any = None
        self._task: asyncio.Task[None] | None = None
        self._last_renew = 0.0
        # Monotonic time until which our lease surely still exists in etcd (see module docstring).
        self._valid_until = 0.0
        self._endpoint_index = 0

    @property
    def holding_back(self) -> str:
        """Why this candidate left a free lock alone at its last check ("" = it did not)."""
        return self._holding_back

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="etcd-election")

    @property
    def valid_until(self) -> float:
        """Monotonic time until which a master's lease surely holds (see the module docstring);
        in the past once it resigns or steps down."""
        return self._valid_until

    def current(self, now: float | None = None) -> Leadership:
        """The view now: a master whose renewal is overdue reads as isolated."""
        return lship.at(self.view, time.monotonic() if now is None else now, self._valid_until)

    async def stop(self, *, resign: bool = True) -> None:
        """Stop campaigning; a master (isolated or not) revokes its lease so a standby wins at once."""
        task, self._task = self._task, None
        if task is not None:
            # Cancel until it has ended: Python 3.11's asyncio.wait_for returns the inner call's
            # result when the cancellation arrives as that call completes (the loop then went on
            # renewing and stop() waited for ever); one cancel per second is bounded.
            while not task.done():
                task.cancel()
                await asyncio.wait([task], timeout=1.0)
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if resign and self.view.role is LeaderRole.MASTER and self._lease is not None:
            # Isolated (current()) before the revocation is sent: a standby may take the lock as
            # soon as etcd applies it, before its reply (if any) reaches us.
            self._valid_until = -1.0
            self._validity_moved()
            await self._revoke()
            self.view = lship.lost(self.view)
        await self._close_client()

    async def _revoke(self) -> None:
        """Revoke our lease (the lock key goes with it, so a standby can take it at its next check)."""
        lease, self._lease = self._lease, None
        if lease is None:
            return
        try:
            client = await self._connect()
            async with asyncio.timeout(self.call_timeout):
                await client.revoke_lease(lease.id)
            log.info("resigned: lease revoked")
        except Exception as exc:  # the lease then expires after its TTL
            log.warning("could not revoke the lease: %s", exc)

    async def _step_down(self, why: StepDown) -> None:
        log.error("holding the lock but cannot act: handing it over (%s)", why)
        self._valid_until = -1.0
        self._validity_moved()
        await self._revoke()
        await self._publish(lship.lost(self.view))

    def _validity_moved(self) -> None:
        if self._on_validity is not None:
            self._on_validity()

    async def _publish(self, view: Leadership) -> None:
        if view == self.view:
            return
        old, self.view = self.view, view
        log.info(
            "leadership changed",
            extra={"from": f"{old.role.value}{'+isolated' if old.isolated else ''}",
                   "to": f"{view.role.value}{'+isolated' if view.isolated else ''}", "holder": view.holder},
        )
        if self._on_change is not None:
            result = self._on_change(view)
            if result is not None:
                await result

    async def _connect(self) -> Any:
        import aetcd  # optional dependency (extra "ha")

        if self._client is None:
            host, port = parse_endpoint(self.endpoints[self._endpoint_index % len(self.endpoints)])
            self._client = aetcd.Client(host=host, port=port, timeout=self.call_timeout, connect_wait_timeout=1)
        return self._client

    async def _close_client(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self._client.close()
            self._client = None

    async def _call(self, coro: Awaitable[Any]) -> Any:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that
        # arrives as the call completes
        async with asyncio.timeout(self.call_timeout):
            return await coro

    async def _run(self) -> None:
        while True:
            try:
                if self.view.role is LeaderRole.MASTER:
                    # Every ttl/3 from the previous renewal's start, not from its end: the validity
                    # counts from the send, so with a slow etcd (each call answered late, inside
                    # the timeout) spacing from the end let it lapse before the next renewal
                    # confirmed the lease: the master flapped unready every cycle.
                    started = time.monotonic()
                    await self._renew()
                    await asyncio.sleep(max(0.0, started + self.ttl / 3 - time.monotonic()))
                else:
                    await self._campaign()
                    if not self.view.serving:
                        await asyncio.sleep(self.check_interval)
            except asyncio.CancelledError:
                raise
            except StepDown as why:
                await self._step_down(why)
            except Exception as exc:
                log.warning("etcd unreachable: %s", exc)
                await self._publish(lship.renew_failed(self.view))
                await self._close_client()
                self._endpoint_index += 1
                if self.view.role is LeaderRole.MASTER and time.monotonic() - self._last_renew > self.ttl:
                    # Our lease has surely expired in etcd; keep serving only while nobody can
                    # have taken over — the gateway decides with every coordinator's view.
                    log.warning("master lease expired while isolated")
                await asyncio.sleep(min(self.check_interval, self.ttl / 3))

    async def _campaign(self) -> None:
        client = await self._connect()
        current = await self._call(client.get(self.key))
        if current is not None:
            # Held (cheap path: one read per check, no lease churn while a master exists).
            self._holding_back = ""
            await self._publish(lship.observed_holder(self.view, self._holder_name(current.value)))
            return
        wait = self._may_acquire() if self._may_acquire is not None else None
        if wait is not None:
            if wait != self._holding_back:
                log.warning("the master lock is free; not taking it yet: %s", wait)
            self._holding_back = wait
            await self._publish(lship.observed_holder(self.view, ""))
            return
        self._holding_back = ""
        sent = time.monotonic()
        lease = await self._call(client.lease(int(max(2, round(self.ttl)))))
        tx = client.transactions
        ok, responses = await self._call(
            client.transaction(
                compare=[tx.create(self.key) == 0],
                success=[tx.put(self.key, self.candidate.encode(), lease)],
                failure=[tx.get(self.key)],
            )
        )
        if ok:
            self._lease = lease
            self._last_renew = time.monotonic()
            self._valid_until = sent + self.ttl * 2 / 3
            await self._publish(lship.acquired(self.view, self.candidate))
            return
        with contextlib.suppress(Exception):
            await self._call(client.revoke_lease(lease.id))
        holder = ""
        with contextlib.suppress(Exception):
            holder = self._holder_name(responses[0][0][0])
        await self._publish(lship.observed_holder(self.view, holder))

    def _holder_name(self, value: bytes) -> str:
        holder = value.decode(errors="replace")
        if holder == self.candidate:
            # A previous incarnation of ours still holds the key: wait for its lease to expire.
            holder = f"{holder} (stale lease)"
        return holder

    async def _renew(self) -> None:
        # Overdue (we were frozen or starved): isolated before anything else is awaited.
        await self._publish(self.current())
        client = await self._connect()
        sent = time.monotonic()
        reply = await self._call(client.refresh_lease(self._lease.id))
        if reply is None or getattr(reply, "TTL", 0) <= 0:
            log.warning("master lease is gone: stepping down")
            self._lease = None
            await self._publish(lship.lost(self.view))
            return
        current = await self._call(client.get(self.key))
        if current is None or current.lease != self._lease.id:
            # Not the key we created under our lease (deleted by hand, perhaps taken by another
            # candidate, which may even share our id: the value alone cannot tell).
            holder = current.value.decode(errors="replace") if current is not None else ""
            self._lease = None
            await self._publish(lship.lost(self.view, holder))
            return
        self._last_renew = time.monotonic()
        self._valid_until = sent + self.ttl * 2 / 3
        await self._publish(lship.renew_ok(self.view))
        self._validity_moved()
