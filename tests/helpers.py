"""Test helpers: waiting on conditions, free ports, process management."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

from motor_common.ports import free_port as free_port

T = TypeVar("T")


@overload
async def wait_for(
    check: Callable[[], Awaitable[T]], *, timeout: float = ..., interval: float = ..., what: str = ...
) -> T: ...


@overload
async def wait_for(
    check: Callable[[], T], *, timeout: float = ..., interval: float = ..., what: str = ...
) -> T: ...


async def wait_for(
    check: Callable[[], Any],
    *,
    timeout: float = 10.0,
    interval: float = 0.05,
    what: str = "condition",
) -> Any:
    """Poll *check* (sync or async) until it returns a truthy value (exceptions count as falsy).

    On timeout the error names what the last poll saw: its falsy result or its exception."""
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        try:
            result = check()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return result
            last = f"last result: {result!r}"
        except Exception as exc:
            last = f"last error: {exc!r}"
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what} ({last})")
        await asyncio.sleep(interval)



def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


async def http_ok(url: str, path: str = "/ready") -> bool:
    """True when ``GET url+path`` answers 200 within 2 s (a wait_for condition for a front's
    readiness); a refused or slow connection is False."""
    import aiohttp

    try:
        async with aiohttp.ClientSession() as s, s.get(url + path, timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


class SurvivesOneCancel:
    """A task body that swallows its first cancellation and ends on the second, as a loop around
    Python 3.11's ``asyncio.wait_for`` does when the cancel arrives as the inner call completes.
    ``running`` is set once the body waits; ``swallowed`` counts the cancellations it ignored."""

    def __init__(self) -> None:
        self.running = asyncio.Event()
        self.swallowed = 0

    async def __call__(self) -> None:
        while True:
            try:
                self.running.set()
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                if self.swallowed:
                    raise
                self.swallowed += 1  # as wait_for did: the loop goes on
