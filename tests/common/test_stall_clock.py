"""StallCompensatedClock (pure): stalls of the receiving event loop do not age heartbeats; and
wait_within, a timeout counted on it."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from motor_common.stall_clock import StallCompensatedClock, lag_monitor, wait_within


class Raw:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_responsive_loop_counts_real_time() -> None:
    raw = Raw()
    c = StallCompensatedClock(raw, period=0.1, tolerance=0.15)
    start = c()
    for _ in range(50):  # the monitor wakes on time (a little late, within tolerance)
        raw.t += 0.12
        c.tick()
    assert c() - start == pytest.approx(6.0) and c.stalled_total == 0.0


def test_a_stall_is_not_counted_even_before_the_monitor_saw_it() -> None:
    raw = Raw()
    c = StallCompensatedClock(raw, period=0.1, tolerance=0.15)
    seen = c()  # a heartbeat arrives
    raw.t += 4.0  # the process is descheduled for 4 s (longer than a 3 s heartbeat timeout)
    assert c() - seen == pytest.approx(0.25)  # a judgement right after the stall: not lost
    assert c.tick() == pytest.approx(3.75)
    assert c() - seen == pytest.approx(0.25) and c.longest_stall == pytest.approx(3.75)
    raw.t += 0.1
    c.tick()
    assert c() - seen == pytest.approx(0.35)  # and time runs on normally afterwards


def test_a_node_silent_through_responsive_time_is_still_declared_lost() -> None:
    raw = Raw()
    c = StallCompensatedClock(raw, period=0.1, tolerance=0.15)
    seen = c()
    raw.t += 5.0  # a stall...
    c.tick()
    for _ in range(31):  # ...then 3.1 s of a responsive loop and no heartbeat: lost (timeout 3 s)
        raw.t += 0.1
        c.tick()
    assert c() - seen > 3.0


def test_the_clock_never_runs_backwards() -> None:
    raw = Raw()
    c = StallCompensatedClock(raw, period=0.1, tolerance=0.0)
    readings = []
    for step in (0.05, 0.3, 0.01, 2.0, 0.1, 0.1, 0.7):
        raw.t += step
        readings.append(c())
        c.tick()
        readings.append(c())
    assert readings == sorted(readings)


# --- wait_within: a budget of responsive time (real event loop) -----------------------------------
async def test_wait_within_gives_up_after_the_budget_and_cancels_the_work() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def never() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"not done within 0\.2s"):
        await wait_within(time.monotonic, 0.2, never())
    assert 0.2 <= time.monotonic() - t0 < 2.0 and started.is_set() and cancelled.is_set()


async def test_wait_within_returns_the_result_or_raises_the_error_of_the_work() -> None:
    async def answer() -> int:
        await asyncio.sleep(0.01)
        return 42

    async def broken() -> int:
        raise ValueError("engine said no")

    assert await wait_within(time.monotonic, 1.0, answer()) == 42
    with pytest.raises(ValueError, match="engine said no"):
        await wait_within(time.monotonic, 1.0, broken())


async def test_a_stall_of_the_loop_does_not_use_up_the_budget() -> None:
    """The work finishes 0.1 s after starting, but the loop is blocked for 1 s meanwhile: within a
    0.3 s budget of the stall-compensated clock it still counts as on time."""
    clock = StallCompensatedClock(period=0.05, tolerance=0.05)
    monitor = asyncio.create_task(lag_monitor(clock, logging.getLogger(__name__), "test"))
    loop = asyncio.get_running_loop()
    try:
        loop.call_later(0.02, time.sleep, 1.0)  # the process stalls while the work is under way
        assert await wait_within(clock, 0.3, asyncio.sleep(0.1, result="done")) == "done"
        assert clock.stalled_total >= 0.8
    finally:
        monitor.cancel()


async def test_cancelling_the_waiter_cancels_the_work() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    waiter = asyncio.create_task(wait_within(time.monotonic, 10.0, work()))
    await asyncio.wait_for(started.wait(), 5)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert cancelled.is_set()
