"""The fault manager: picks a strategy for a fault, runs it while the instance is RECOVERING, and
feeds its explicit result back (STYLE rule 12).

- A fault report → :func:`~motor_controller.fault_policy.choose_strategy` (gated by
  ``fault_tolerance_config``; a previous FAILED strategy of the instance escalates). At most one
  strategy runs per instance; a report for an instance already recovering joins that recovery (an
  ENGINE_DEAD report tells a no-restart strategy to stop waiting).
- A no-restart strategy (await_recovery) that fails escalates at once, inside the same recovery
  (the instance stays RECOVERING): nobody reports a persisting fault again.
- A partial node loss (the reconcile plan finds it) → a node restart of the surviving nodes.
- Start: the host moves the instance to RECOVERING (coordinators then see it PAUSED) *before* the
  report is answered. End: DONE waits (bounded) until heartbeats show the instance healthy, so the
  host can go RECOVERING → INACTIVE → ACTIVE in one step (coordinators see a RESUME, not DEL+ADD);
  FAILED is remembered for escalation; ABORTED (instance deleted, shutdown) changes nothing.

The host (the controller) is behind :class:`RecoveryHost`, strategies are built by
:class:`StrategyFactory`: both are replaced by fakes in tests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol

from motor_common.tasks import TaskOwner
from motor_controller.config import FaultToleranceConfig
from motor_controller.fault_policy import (
    NODE_RESTART,
    FtState,
    Outcome,
    Progress,
    Strategy,
    StrategyResult,
    choose_strategy,
    escalation,
    relaunch_expected,
)
from motor_controller.model import FaultReport, ManagedInstance
from motor_controller.recovery_metrics import record

log = logging.getLogger(__name__)


class RecoveryHost(Protocol):
    def instance(self, instance_id: int) -> ManagedInstance | None: ...
    def instance_healthy(self, instance_id: int) -> bool: ...
    async def begin_recovery(self, instance_id: int, strategy: str) -> bool: ...
    async def end_recovery(self, instance_id: int, result: StrategyResult) -> None: ...
    def scale_down_eligible(self, instance_id: int, report: FaultReport) -> bool: ...


# (strategy name, instance, its progress record, node ids concerned, fire-and-forget spawner) -> strategy
StrategyFactory = Callable[
    [str, ManagedInstance, Progress, Sequence[str], Callable[[Coroutine[Any, Any, None]], None]], Strategy | None
]


class FaultManager:
    def __init__(
        self,
        config: Callable[[], FaultToleranceConfig],
        host: RecoveryHost,
        build: StrategyFactory,
        *,
        healthy_wait_sec: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._config = config
        self._host = host
        self._build = build
        self._healthy_wait = healthy_wait_sec
        self._clock = clock
        self._sleep = sleep
        self.progress: dict[int, Progress] = {}
        self.running: dict[int, Strategy] = {}
        self.failed: dict[int, str] = {}  # instance id -> name of its last FAILED strategy
        # instance id -> whether the engine death that ended its await-recovery allows a DP scale-down
        self._dead_eligible: dict[int, bool] = {}
        self.results: list[tuple[int, str, StrategyResult]] = []  # bounded history (observability, tests)
        self._tasks = TaskOwner("fault-manager")
        self._aborts: set[asyncio.Task[None]] = set()

    # --- decisions ------------------------------------------------------------------------------
    async def on_fault(self, report: FaultReport) -> bool:
        """Handle a fault report; True when an engine relaunch in place is expected (freeze)."""
        ft = self._config()
        if not ft.enable_fault_tolerance:
            return False
        mi = self._host.instance(report.instance_id)
        if mi is None or not mi.live or mi.blocked:
            return False
        current = self.running.get(mi.id)
        if current is not None:
            dead = getattr(current, "engine_dead", None)
            if report.level == "engine_dead" and callable(dead):
                # A no-restart strategy stops waiting; its failure escalates at once, deciding as
                # a fresh death would (DP scale-down when this death is eligible).
                self._dead_eligible[mi.id] = self._host.scale_down_eligible(mi.id, report)
                dead()
            return relaunch_expected(current.name, ft)
        name = choose_strategy(report, ft, previous_failed=self.failed.get(mi.id),
                               scale_down_eligible=self._host.scale_down_eligible(mi.id, report))
        if name is None:
            return False
        started = await self._begin(mi, name, mi.node_ids)
        return started and relaunch_expected(name, ft)

    async def on_partial_loss(self, instance_id: int, survivors: Sequence[str]) -> None:
        """Some nodes of the instance are lost: restart the survivors so it is rescheduled whole."""
        if not self._config().enable_fault_tolerance or instance_id in self.running:
            return
        mi = self._host.instance(instance_id)
        if mi is None or not mi.live or mi.blocked:
            return
        await self._begin(mi, NODE_RESTART, survivors)

    def resume(self, instance_id: int, name: str) -> bool:
        """Run *name* for an instance a previous controller left RECOVERING (no RECOVERY_BEGIN:
        it is persisted already); the factory finds what to resume in the store."""
        mi = self._host.instance(instance_id)
        if mi is None or not mi.live or mi.blocked or mi.id in self.running:
            return False
        progress = self.progress.setdefault(mi.id, Progress())
        progress.phase = "recovered"  # tells the factory it resumes (engine_relaunch.resume_plan)
        strategy = self._build(name, mi, progress, mi.node_ids, self._spawn_abort)
        if strategy is None:
            return False
        self.running[mi.id] = strategy
        progress.strategy, progress.phase, progress.state = name, "recovered", FtState.RUNNING
        log.warning("fault strategy resumed after a controller restart", extra={"instance_id": mi.id, "strategy": name})
        self._tasks.spawn(self._drive(mi, strategy, progress), name=f"strategy-{name}-{mi.id}")
        return True

    async def _begin(self, mi: ManagedInstance, name: str, nodes: Sequence[str]) -> bool:
        progress = self.progress.setdefault(mi.id, Progress())
        strategy = self._build(name, mi, progress, nodes, self._spawn_abort)
        if strategy is None:
            return False
        if mi.id in self.running:  # raced with another report while awaiting nothing: keep the first
            return False
        self.running[mi.id] = strategy
        if not await self._host.begin_recovery(mi.id, name):
            self.running.pop(mi.id, None)
            return False
        progress.strategy, progress.phase, progress.state, progress.last_error = name, "starting", FtState.RUNNING, ""
        log.warning("fault strategy started", extra={"instance_id": mi.id, "strategy": name, "nodes": list(nodes)})
        self._tasks.spawn(self._drive(mi, strategy, progress), name=f"strategy-{name}-{mi.id}")
        return True

    async def _run_one(self, mi: ManagedInstance, strategy: Strategy) -> StrategyResult:
        try:
            return await strategy.run(mi)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("fault strategy crashed", extra={"instance_id": mi.id, "strategy": strategy.name})
            return StrategyResult(Outcome.FAILED, f"strategy crashed: {exc!r}")

    def _escalate(self, mi: ManagedInstance, failed: Strategy, result: StrategyResult,
                  progress: Progress) -> tuple[ManagedInstance, Strategy] | None:
        """A no-restart strategy failed: the next strategy, started at once in the same recovery."""
        name = escalation(failed.name, self._config(),
                          dead_scale_down_eligible=self._dead_eligible.pop(mi.id, False))
        live = self._host.instance(mi.id)
        if name is None or live is None or not live.live:
            return None
        nxt = self._build(name, live, progress, live.node_ids, self._spawn_abort)
        if nxt is None:
            return None
        self.results.append((mi.id, failed.name, result))
        record(failed.name, result)
        self.running[mi.id] = nxt
        progress.strategy, progress.phase, progress.state, progress.last_error = name, "starting", FtState.RUNNING, result.detail
        log.warning("fault strategy failed, escalating",
                    extra={"instance_id": mi.id, "failed": failed.name, "strategy": name, "detail": result.detail})  # fmt: skip
        return live, nxt

    async def _drive(self, mi: ManagedInstance, strategy: Strategy, progress: Progress) -> None:
        try:
            while True:
                result = await self._run_one(mi, strategy)
                nxt = self._escalate(mi, strategy, result, progress) if result.outcome is Outcome.FAILED else None
                if nxt is None:
                    break
                mi, strategy = nxt
            if result.outcome is Outcome.DONE:
                self.failed.pop(mi.id, None)
                progress.state = FtState.IDLE
                deadline = self._clock() + self._healthy_wait
                while not self._host.instance_healthy(mi.id) and self._clock() < deadline:
                    await self._sleep(0.05)
            elif result.outcome is Outcome.FAILED:
                self.failed[mi.id] = strategy.name  # the next decision escalates
                progress.state = FtState.FAILED
                progress.last_error = result.detail
            else:
                progress.state = FtState.IDLE
            self.results.append((mi.id, strategy.name, result))
            record(strategy.name, result)
            del self.results[:-100]
            log.warning(
                "fault strategy finished",
                extra={"instance_id": mi.id, "strategy": strategy.name, "outcome": result.outcome.value,
                       "detail": result.detail},
            )  # fmt: skip
            await self._host.end_recovery(mi.id, result)
        finally:
            if self.running.get(mi.id) is strategy:
                del self.running[mi.id]

    def _spawn_abort(self, coro: Coroutine[Any, Any, None]) -> None:
        """Fire and forget (kept referenced until done; awaited briefly on close)."""
        task = asyncio.get_running_loop().create_task(coro, name="fire-and-forget-abort")
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    def forget(self, instance_id: int) -> None:
        """The instance is gone for good (the controller forgets its deleted record)."""
        self.failed.pop(instance_id, None)
        self.progress.pop(instance_id, None)
        self._dead_eligible.pop(instance_id, None)

    async def close(self, abort_grace: float = 1.0) -> None:
        """Cancel running strategies (they fire their aborts), give the aborts a moment, stop."""
        for strategy in list(self.running.values()):
            await strategy.stop()
        await self._tasks.close()
        pending = list(self._aborts)
        if pending:
            _, late = await asyncio.wait(pending, timeout=abort_grace)
            for task in late:
                task.cancel()
