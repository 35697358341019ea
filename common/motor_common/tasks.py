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
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
