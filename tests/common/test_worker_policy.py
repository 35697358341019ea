"""A worker supervisor's decisions (``motor_common.worker_policy``), without processes."""

from __future__ import annotations

import pytest

from motor_common.openai_front.admission import AdmissionConfig
from motor_common.worker_policy import (
    Heartbeat,
    RestartPolicy,
    admission_share,
    admission_too_small,
    share,
    unresponsive,
)


def test_a_worker_that_dies_young_waits_longer_each_time_up_to_the_cap() -> None:
    policy = RestartPolicy(base_delay=0.1, max_delay=1.0, stable_after=10.0)
    delays = []
    quick = 0
    for _ in range(6):
        delay, quick = policy.next_delay(uptime=0.5, quick_deaths=quick)
        delays.append(delay)
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert quick == 6


def test_a_worker_that_was_up_long_enough_is_restarted_at_once_and_the_count_resets() -> None:
    policy = RestartPolicy(base_delay=0.1, max_delay=1.0, stable_after=10.0)
    assert policy.next_delay(uptime=10.0, quick_deaths=5) == (0.0, 0)
    assert policy.next_delay(uptime=9.9, quick_deaths=0) == (0.1, 1)


def test_a_huge_count_of_quick_deaths_does_not_overflow() -> None:
    assert RestartPolicy(max_delay=10.0).next_delay(0.0, 10**6) == (10.0, 10**6 + 1)


def test_unresponsive_after_the_timeout_since_the_last_heartbeat() -> None:
    assert not unresponsive(now=109.0, started=100.0, last_beat=105.0, timeout=4.0, startup_grace=60.0)
    assert unresponsive(now=109.1, started=100.0, last_beat=105.0, timeout=4.0, startup_grace=60.0)


def test_a_heartbeat_older_than_the_start_is_not_held_against_the_new_worker() -> None:
    # A beat file left by the previous incarnation: time counts from this start.
    assert not unresponsive(now=103.0, started=100.0, last_beat=50.0, timeout=4.0, startup_grace=60.0)
    assert unresponsive(now=104.5, started=100.0, last_beat=50.0, timeout=4.0, startup_grace=60.0)


def test_before_the_first_heartbeat_the_startup_grace_applies() -> None:
    assert not unresponsive(now=159.0, started=100.0, last_beat=None, timeout=4.0, startup_grace=60.0)
    assert unresponsive(now=160.5, started=100.0, last_beat=None, timeout=4.0, startup_grace=60.0)


def test_a_wall_clock_step_forward_does_not_make_a_beating_worker_unresponsive() -> None:
    # beats every second; between two of them the wall clock jumps 15 s ahead (NTP step, VM resume)
    hb = Heartbeat(started=1000.0)
    wall = 1_700_000_000
    for t in range(1, 6):
        hb.observe(1000.0 + t, (wall + t) * 10**9)
    hb.observe(1006.0, (wall + 6 + 15) * 10**9)
    assert hb.seen == 1006.0
    assert not hb.unresponsive(1007.0, timeout=10.0, startup_grace=60.0)
    hb.observe(1007.0, (wall + 7 + 15) * 10**9)
    assert not hb.unresponsive(1016.5, timeout=10.0, startup_grace=60.0)


def test_a_wall_clock_step_back_still_counts_as_a_beat() -> None:
    hb = Heartbeat(started=0.0)
    hb.observe(1.0, 500 * 10**9)
    hb.observe(2.0, 100 * 10**9)  # the clock went back: a new stamp all the same
    assert not hb.unresponsive(11.5, timeout=10.0, startup_grace=60.0)


def test_a_stamp_that_stops_changing_is_silence_on_the_monotonic_clock() -> None:
    hb = Heartbeat(started=0.0)
    assert not hb.unresponsive(59.0, timeout=4.0, startup_grace=60.0)  # no beat yet: startup grace
    hb.observe(2.0, 7 * 10**9)
    for now in (3.0, 5.0, 6.0):  # the file is still there, unchanged
        hb.observe(now, 7 * 10**9)
    assert not hb.unresponsive(6.0, timeout=4.0, startup_grace=60.0)
    assert hb.unresponsive(6.1, timeout=4.0, startup_grace=60.0)


@pytest.mark.parametrize("workers", [1, 2, 3, 4, 7, 16])
@pytest.mark.parametrize("limit", [0, 1, 2, 5, 100, 511, 512, 1000])
def test_the_shares_of_a_limit_add_up_to_it_and_differ_by_at_most_one(limit: int, workers: int) -> None:
    parts = [share(limit, i, workers) for i in range(workers)]
    assert sum(parts) == limit
    assert max(parts) - min(parts) <= 1
    assert parts == sorted(parts, reverse=True)  # the first limit % workers get the extra one


def test_share_examples() -> None:
    assert [share(100, i, 4) for i in range(4)] == [25, 25, 25, 25]
    assert [share(10, i, 4) for i in range(4)] == [3, 3, 2, 2]
    assert [share(0, i, 3) for i in range(3)] == [0, 0, 0]  # unbounded stays unbounded
    with pytest.raises(ValueError):
        share(10, 4, 4)


def test_a_worker_enforces_its_share_of_the_counts_and_the_whole_byte_bounds() -> None:
    cfg = AdmissionConfig(max_in_flight_per_model=10, max_queued_per_model=3, max_in_flight_per_key=0,
                          max_queued_per_key=7, queue_timeout_sec=5, max_in_flight_bytes=1000,
                          max_buffered_bytes=2000, retry_after_sec=2)
    shares = [admission_share(cfg, i, 4) for i in range(4)]
    assert [s.max_in_flight_per_model for s in shares] == [3, 3, 2, 2]
    assert [s.max_queued_per_model for s in shares] == [1, 1, 1, 0]  # 0 here: no waiting on worker 3
    assert [s.max_in_flight_per_key for s in shares] == [0, 0, 0, 0]  # unbounded
    assert [s.max_queued_per_key for s in shares] == [2, 2, 2, 1]
    for s in shares:  # one process's memory, timeouts: unchanged
        assert (s.max_in_flight_bytes, s.max_buffered_bytes, s.queue_timeout_sec, s.retry_after_sec) == \
            (1000, 2000, 5, 2)
    assert admission_share(cfg, 0, 1) is cfg  # one process: the limits as configured


def test_an_in_flight_limit_smaller_than_the_workers_is_refused_by_name() -> None:
    assert admission_too_small(AdmissionConfig(max_in_flight_per_model=3), 4) is not None
    assert admission_too_small(AdmissionConfig(max_in_flight_per_model=4), 4) is None
    assert admission_too_small(AdmissionConfig(max_in_flight_per_model=0, max_in_flight_per_key=0), 64) is None
    assert admission_too_small(AdmissionConfig(max_in_flight_per_model=1), 1) is None
    # A queue limit below the workers is fine: a queue share of 0 means "no waiting there".
    assert admission_too_small(AdmissionConfig(max_queued_per_model=1, max_queued_per_key=1), 4) is None
    why = admission_too_small(AdmissionConfig(max_in_flight_per_key=2), 3)
    assert why is not None and "admission.max_in_flight_per_key" in why and "at least 3" in why
    with pytest.raises(ValueError, match="max_in_flight_per_model"):
        admission_share(AdmissionConfig(max_in_flight_per_model=1), 0, 2)
