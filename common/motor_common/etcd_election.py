"""Leader election through an etcd lease + lock key (aetcd client).

The candidate that creates ``key`` (compare ``create_revision == 0``) under its own lease is
master; it refreshes the lease every ``ttl / 3``. A standby checks every ``check_interval``.
Every etcd call has a timeout. State changes go through the pure ``motor_common.leadership``
functions and are published to ``on_change``.
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
        self.view: Leadership = lship.initial_candidate()
        self._client: Any = None
        self._lease: Any = None
        self._task: asyncio.Task[None] | None = None
        self._last_renew = 0.0
        self._endpoint_index = 0

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="etcd-election")

    async def stop(self, *, resign: bool = True) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if resign and self.view.role is LeaderRole.MASTER and self._lease is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._client.revoke_lease(self._lease.id), self.call_timeout)
        await self._close_client()

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
                await asyncio.wait_for(self._client.close(), 1.0)
            self._client = None

    async def _call(self, coro: Awaitable[Any]) -> Any:
        return await asyncio.wait_for(coro, self.call_timeout)

    async def _run(self) -> None:
        while True:
            try:
                if self.view.role is LeaderRole.MASTER:
                    await self._renew()
                    await asyncio.sleep(self.ttl / 3)
                else:
                    await self._campaign()
                    if not self.view.serving:
                        await asyncio.sleep(self.check_interval)
            except asyncio.CancelledError:
                raise
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
            await self._publish(lship.acquired(self.view, self.candidate))
            return
        with contextlib.suppress(Exception):
            await self._call(client.revoke_lease(lease.id))
        holder = ""
        with contextlib.suppress(Exception):
            holder = responses[0][0][0].decode()
        if holder == self.candidate:
            # A previous incarnation of ours still holds the key: wait for its lease to expire.
            holder = f"{holder} (stale lease)"
        await self._publish(lship.observed_holder(self.view, holder))

    async def _renew(self) -> None:
        client = await self._connect()
        reply = await self._call(client.refresh_lease(self._lease.id))
        if reply is None or getattr(reply, "TTL", 0) <= 0:
            log.warning("master lease is gone: stepping down")
            self._lease = None
            await self._publish(lship.lost(self.view))
            return
        current = await self._call(client.get(self.key))
        holder = current.value.decode() if current is not None else ""
        if holder != self.candidate:
            self._lease = None
            await self._publish(lship.lost(self.view, holder))
            return
        self._last_renew = time.monotonic()
        await self._publish(lship.renew_ok(self.view))
