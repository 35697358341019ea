"""StallCompensatedClock (pure): stalls of the receiving event loop do not age heartbeats."""

from __future__ import annotations

import pytest

from motor_common.stall_clock import StallCompensatedClock


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
