"""The supervisor's decisions (``motor_gateway.worker_policy``), without processes."""

from __future__ import annotations

from motor_gateway.worker_policy import RestartPolicy, unresponsive


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
