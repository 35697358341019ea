"""One gRPC channel per peer address, opened on first use and closed once idle.

A controller calls many nodemanagers whose addresses come and go (a rescheduled pod comes back on
a new IP): a pool that only ever opened channels would keep one per address it ever called, with
its sockets and reconnect state, for the life of the process. Here a channel that has had no call
in flight for ``idle_close_sec`` is closed at the next use of the pool; a channel with a call in
flight is never closed, so a long StopNode or RestartEngine is not cut.

:func:`idle_addresses` is the decision (pure, tested without sockets); :class:`ChannelPool` the I/O.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

import grpc

from motor_common.grpc_client import open_channel
from motor_common.tls import TlsConfig

DEFAULT_IDLE_CLOSE_SEC = 300.0


@dataclass
class Use:
    """How a pooled channel is used: calls in flight, and when the last one ended (monotonic s)."""

    in_flight: int = 0
    last_used: float = 0.0


def idle_addresses(uses: Mapping[str, Use], now: float, idle_close_sec: float) -> list[str]:
    """The addresses whose channel can be closed: no call in flight, none ended in the last
    *idle_close_sec* seconds."""
    return [a for a, u in uses.items() if u.in_flight == 0 and now - u.last_used >= idle_close_sec]


class ChannelPool:
    def __init__(self, tls: TlsConfig | None = None, *, idle_close_sec: float = DEFAULT_IDLE_CLOSE_SEC,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        if idle_close_sec <= 0:
            raise ValueError("idle_close_sec must be > 0")
        self._tls = tls
        self._idle = idle_close_sec
        self._clock = clock
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._uses: dict[str, Use] = {}
        self._next_sweep = 0.0

    def addresses(self) -> list[str]:
        """The addresses with an open channel (for tests and status)."""
        return sorted(self._channels)

    @asynccontextmanager
    async def channel(self, address: str) -> AsyncIterator[grpc.aio.Channel]:
        """The channel to *address* for the duration of one call (it stays open while in use)."""
        await self._sweep()
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = open_channel(address, tls=self._tls)
            self._uses[address] = Use()
        use = self._uses[address]
        use.in_flight += 1
        try:
            yield ch
        finally:
            use.in_flight -= 1
            use.last_used = self._clock()

    async def _sweep(self) -> None:
        now = self._clock()
        if now < self._next_sweep:
            return
        self._next_sweep = now + self._idle / 4
        idle = idle_addresses(self._uses, now, self._idle)
        closing = []
        for address in idle:  # all taken out before the first await: no call can pick one up
            del self._uses[address]
            closing.append(self._channels.pop(address))
        for ch in closing:
            await ch.close()  # nothing in flight on it: returns at once

    async def close(self) -> None:
        channels, self._channels, self._uses = list(self._channels.values()), {}, {}
        for ch in channels:
            await ch.close()
