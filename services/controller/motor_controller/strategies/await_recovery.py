"""Await recovery (ENGINE_UNHEALTHY): the engine is alive but unhealthy and may recover by itself.

The instance is RECOVERING while this runs (coordinators see it PAUSED). The strategy polls the
observed health of the instance (fresh heartbeats, every endpoint NORMAL — i.e. the nodemanagers'
health probes) and ends:

- DONE when the instance has been healthy for ``await_recovery_stable_sec`` without interruption
  (a stability window, so the heartbeat still showing NORMAL right after the report does not count);
- FAILED when ``await_recovery_timeout_sec`` passed first, or an ENGINE_DEAD report arrived
  meanwhile (:meth:`AwaitRecovery.engine_dead`). The fault manager then escalates at once to an
  engine relaunch (gated by ``enable_engine_relaunch``; SPEC §5: "a strategy that expected the engine
  to recover without restart and failed is marked failed; the next decision escalates");
- ABORTED when the instance is deleted.

It never restarts anything itself. :func:`recovery_verdict` is the pure decision.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from motor_controller.config import FaultToleranceConfig
from motor_controller.fault_policy import AWAIT_RECOVERY, Outcome, Progress, StrategyResult
from motor_controller.model import ManagedInstance

log = logging.getLogger(__name__)


def recovery_verdict(
    *, now: float, deadline: float, healthy_since: float | None, stable_sec: float, dead: bool
) -> StrategyResult | None:
    """The result once it is known, else None (keep waiting). Pure."""
    if dead:
        return StrategyResult(Outcome.FAILED, "engine reported dead while awaiting recovery")
    if healthy_since is not None and now - healthy_since >= stable_sec:
        return StrategyResult(Outcome.DONE, f"healthy again for {stable_sec:g}s without a restart")
    if now >= deadline:
        return StrategyResult(Outcome.FAILED, "engine not healthy again within the await-recovery deadline")
    return None


class AwaitRecovery:
    name = AWAIT_RECOVERY

    def __init__(
        self,
        config: FaultToleranceConfig,
        progress: Progress,
        *,
        healthy: Callable[[int], bool],
        deleted: Callable[[int], bool],
        poll_interval: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._cfg = config
        self.progress = progress
        self._healthy = healthy
        self._deleted = deleted
        self._poll = poll_interval
        self._clock = clock
        self._sleep = sleep
        self._task: asyncio.Task[Any] | None = None
        self._dead = False

    def engine_dead(self) -> None:
        """An ENGINE_DEAD report for the instance arrived: stop waiting (the fault manager escalates)."""
        self._dead = True

    async def run(self, instance: ManagedInstance) -> StrategyResult:
        self._task = asyncio.current_task()
        self.progress.phase = "await"
        timeout = self._cfg.await_recovery_timeout_sec
        deadline = self._clock() + timeout
        healthy_since: float | None = None
        log.warning("awaiting engine recovery without restart (up to %gs)", timeout, extra={"instance_id": instance.id})
        while True:
            if self._deleted(instance.id):
                return StrategyResult(Outcome.ABORTED, "instance deleted")
            now = self._clock()
            if self._healthy(instance.id):
                healthy_since = now if healthy_since is None else healthy_since
            else:
                healthy_since = None
            verdict = recovery_verdict(now=now, deadline=deadline, healthy_since=healthy_since,
                                       stable_sec=self._cfg.await_recovery_stable_sec, dead=self._dead)  # fmt: skip
            if verdict is not None:
                self.progress.phase = "done" if verdict.outcome is Outcome.DONE else "expired"
                return verdict
            await self._sleep(self._poll)

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
