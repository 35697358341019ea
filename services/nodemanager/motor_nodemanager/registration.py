"""Registration with the controller: a bounded retry schedule, then give up (the caller exits)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from motor_common.errors import MotorError

log = logging.getLogger(__name__)
T = TypeVar("T")


def backoff_schedule(max_attempts: int, base_sec: float) -> list[float]:
    """Waits between attempts: base, 2*base, 4*base, ... (2, 4, 8, 16 s for 5 attempts, base 2)."""
    return [base_sec * (2**i) for i in range(max_attempts - 1)]


class RegistrationFailed(Exception):
    pass


async def register_with_retry(
    attempt: Callable[[], Awaitable[T]],
    *,
    max_attempts: int,
    base_sec: float,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    waits = backoff_schedule(max_attempts, base_sec)
    last: BaseException | None = None
    for n in range(1, max_attempts + 1):
        try:
            return await attempt()
        except MotorError as exc:
            last = exc
            log.warning("registration attempt %d/%d failed: %s", n, max_attempts, exc.message)
        if n <= len(waits):
            await sleep(waits[n - 1])
    raise RegistrationFailed(f"Registration failed after maximum retries ({max_attempts}): {last}")
