"""Ownership of background tasks: every task has an owner that cancels it on shutdown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class TaskOwner:
    """Holds background tasks; logs their crashes; cancels and awaits them on :meth:`close`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def spawn(self, coro: Coroutine[Any, Any, Any], *, name: str | None = None) -> asyncio.Task[Any]:
        if self._closed:
            coro.close()
            raise RuntimeError(f"{self.name}: cannot spawn after close")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            if task.cancelling() == 0:  # nobody called cancel(): a stray CancelledError ended it
                # (e.g. grpc.aio raises one in a call whose channel was closed under it)
                log.error("background task ended by a CancelledError nobody requested",
                          extra={"owner": self.name, "task": task.get_name()})
            return
        exc = task.exception()
        if exc is not None:
            log.error(
                "background task crashed",
                extra={"owner": self.name, "task": task.get_name()},
                exc_info=exc,
            )

    def __len__(self) -> int:
        return len(self._tasks)

    async def close(self, timeout: float = 5.0) -> None:
        """Cancel every task and wait for them, at most *timeout*. A task that survives its
        cancellation (Python 3.11's asyncio.wait_for swallows one that arrives as its inner call
        completes) is cancelled again every half second; one still running at the end is logged."""
        self._closed = True
        pending = set(self._tasks)
        deadline = asyncio.get_running_loop().time() + timeout
        while pending:
            for task in pending:
                task.cancel()
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                log.error("background tasks still running after close",
                          extra={"owner": self.name, "tasks": sorted(t.get_name() for t in pending)})
                return
            _, pending = await asyncio.wait(pending, timeout=min(left, 0.5))
