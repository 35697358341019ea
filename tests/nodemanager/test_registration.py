"""Registration retry schedule."""

from __future__ import annotations

import pytest

from motor_common.errors import Unavailable
from motor_nodemanager.registration import RegistrationFailed, backoff_schedule, register_with_retry


def test_default_schedule_is_2_4_8_16() -> None:
    assert backoff_schedule(5, 2.0) == [2.0, 4.0, 8.0, 16.0]


async def test_gives_up_after_max_attempts_sleeping_the_schedule() -> None:
    slept: list[float] = []
    calls = 0

    async def sleep(s: float) -> None:
        slept.append(s)

    async def attempt() -> str:
        nonlocal calls
        calls += 1
        raise Unavailable("down")

    with pytest.raises(RegistrationFailed, match="maximum retries"):
        await register_with_retry(attempt, max_attempts=5, base_sec=2.0, sleep=sleep)
    assert calls == 5
    assert slept == [2.0, 4.0, 8.0, 16.0]


async def test_succeeds_on_a_later_attempt() -> None:
    calls = 0

    async def sleep(s: float) -> None:
        pass

    async def attempt() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise Unavailable("down")
        return "ok"

    assert await register_with_retry(attempt, max_attempts=5, base_sec=2.0, sleep=sleep) == "ok"
    assert calls == 3
