"""Timers that survive a busy box: a monotonic clock that stops while this process's event loop is
stalled (the class is pure; :func:`lag_monitor` is the task that feeds it).

A node is lost when its last heartbeat is older than the timeout. Measured with the raw monotonic
clock, a controller whose event loop was starved for seconds (CPU contention, a long synchronous
step, a burst of other work) wakes up, judges first, and declares lost every node whose frames are
still waiting unread in its sockets: an instance flap caused by load alone.

:class:`StallCompensatedClock` only advances while the loop proves it is running: a monitor task
sleeps ``period`` seconds and calls :meth:`tick`; time beyond ``period + tolerance`` between two
ticks is a stall and is not counted. Between ticks, reading the clock never runs more than
``period + tolerance`` ahead of the last tick, so a judgement made right after a stall (before the
monitor ran) does not count the stall either. Heartbeat ages therefore count missed intervals of
*responsive* receiving time; on a loop that is merely slow the clock runs slower and a lost node is
declared later, never earlier.

Users: the controller (heartbeat ages, every fault-manager timer), the coordinator (how long an
engine has been silent, breaker cool-downs) and the nodemanager (each engine /health probe's
timeout, through :func:`wait_within`, and its node timers): a process frozen or starved for
seconds does not wake up and blame the engines for its own silence.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from prometheus_client import Counter

T = TypeVar("T")

# Every process that runs lag_monitor: how long its event loop was stalled (not counted in timers).
STALLED = Counter("motor_event_loop_stalled_seconds",
                  "Seconds this process's event loop was stalled (starved of CPU or blocked), not counted "
                  "in its stall-compensated timers")  # fmt: skip


class StallCompensatedClock:
    def __init__(self, raw: Callable[[], float] = time.monotonic, *, period: float = 0.1,
                 tolerance: float = 0.15) -> None:
        if period <= 0 or tolerance < 0:
            raise ValueError("period must be > 0 and tolerance >= 0")
        self._raw = raw
        self.period = period
        self.tolerance = tolerance
        self._last_tick = raw()
        self._offset = 0.0  # stall time not counted so far
        self.stalled_total = 0.0  # observability: seconds of loop stall not counted
        self.longest_stall = 0.0

    @property
    def _slack(self) -> float:
        return self.period + self.tolerance

    def __call__(self) -> float:
        raw = self._raw()
        pending = max(0.0, raw - self._last_tick - self._slack)  # a stall the monitor has not seen yet
        return raw - self._offset - pending

    def tick(self) -> float:
        """The monitor woke after sleeping ``period``: count the stall since the last tick (returned)."""
        raw = self._raw()
        stall = max(0.0, raw - self._last_tick - self._slack)
        self._last_tick = raw
        self._offset += stall
        self.stalled_total += stall
        self.longest_stall = max(self.longest_stall, stall)
        return stall


async def lag_monitor(clock: StallCompensatedClock, log: logging.Logger, what: str,
                      warn_after: float = 1.0) -> None:
    """Feed *clock* forever (run it as an owned task); log each stall of *warn_after* s or more."""
    clock.tick()  # the time before the monitor ran is not a stall
    while True:
        await asyncio.sleep(clock.period)
        stall = clock.tick()
        if stall > 0:
            STALLED.inc(stall)
        if stall >= warn_after:
            log.warning("event loop stalled: %.1fs not counted in %s", stall, what,
                        extra={"stalled_total_sec": round(clock.stalled_total, 1)})


async def wait_within(clock: Callable[[], float], seconds: float, aw: Awaitable[T]) -> T:
    """Await *aw* for at most *seconds* of *clock* time, then cancel it and raise TimeoutError.

    On a :class:`StallCompensatedClock` the budget counts only time this process's loop was
    running: a plain timeout that expires during a stall fires as soon as the loop wakes, before
    the answer already waiting in a socket is read, and blames the peer for this process's own
    starvation. Here the budget is checked again on waking, and the wait goes on for what is left.
    """
    task = asyncio.ensure_future(aw)
    start = clock()
    try:
        while (left := seconds - (clock() - start)) > 0:
            done, _ = await asyncio.wait((task,), timeout=left)
            if done:
                return task.result()
        raise TimeoutError(f"not done within {seconds}s")
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # given up: its outcome is moot
                await task
