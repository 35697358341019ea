"""Engine relaunch in place (ENGINE_DEAD), two phases (seed: EngineRelaunchStrategy).

Phase 1 — relaunch the engines of **every** node of the instance together (the ranks of one
instance form one collective group):

1. probe every nodemanager (``GetStatus``); any unreachable → phase 2 at once;
2. dispatch ``RestartEngine(RESTART)`` to each, with at most ``engine_relaunch_dispatch_retries``
   retries of a transient failure, each call bounded by what is left of
   ``engine_relaunch_complete_timeout_sec`` plus the RPC timeout (the nodemanager answers once its
   engines are NORMAL, within its ``engine_restart_wait_timeout_sec``); a nodemanager that answers ABORTED/RELAUNCH_IN_PROGRESS is already
   relaunching and counts as dispatched; INTERNAL (its relaunch failed) or FAILED_PRECONDITION do not;
3. poll ``GetStatus`` every ``engine_relaunch_poll_interval_sec`` until every node runs the instance
   with all endpoints NORMAL → DONE; a node unreachable for
   ``engine_relaunch_nm_unreachable_threshold`` consecutive polls, or
   ``engine_relaunch_complete_timeout_sec`` elapsed → phase 2.

Phase 2 — fall back to restarting the nodes: ``RestartEngine(ABORT)`` goes only to nodemanagers whose
restart was **not** dispatched (they unfreeze and self-terminate, so heartbeat loss / the supervisor
restarts the node); nodemanagers already relaunching stay frozen. An abort that fails is logged as an
error naming the node. Result FAILED (the next decision escalates).

The instance deleted at any point → ABORTED at once. Cancelled (controller shutdown) → a
fire-and-forget abort to every node, so no nodemanager stays frozen for nothing.

The decisions (dispatch classification, completion, abort targeting) are pure functions below.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from motor_common.domain import EndpointStatus
from motor_common.errors import Aborted, DeadlineExceeded, MotorError, Unavailable
from motor_controller.config import FaultToleranceConfig
from motor_controller.fault_policy import ENGINE_RELAUNCH, Outcome, Progress, StrategyResult
from motor_controller.model import ManagedInstance, NodeState, NodeStatus
from motor_controller.peers import NodeManagers

log = logging.getLogger(__name__)


def dispatch_timeout(deadline: float, now: float, margin: float) -> float:
    """Deadline of one RestartEngine(RESTART) call: what is left of the relaunch, plus a margin.

    The nodemanager answers once its engines are NORMAL (bounded by its own
    ``engine_restart_wait_timeout_sec``), so the call may legitimately last as long as the relaunch."""
    return max(deadline - now, 0.0) + margin


@dataclass(frozen=True)
class Target:
    node_id: str
    address: str


class Dispatch(enum.Enum):
    DISPATCHED = "dispatched"
    RETRY = "retry"  # transient: try again if the budget allows
    FAILED = "failed"  # the node cannot relaunch: not dispatched


# --- pure decisions --------------------------------------------------------------------------------
def classify_dispatch_error(exc: MotorError) -> Dispatch:
    if isinstance(exc, Aborted) and exc.reason == "RELAUNCH_IN_PROGRESS":
        return Dispatch.DISPATCHED  # a relaunch is already running there
    if isinstance(exc, (Unavailable, DeadlineExceeded, Aborted)):
        return Dispatch.RETRY
    return Dispatch.FAILED


def relaunch_complete(status: NodeStatus, instance_id: int) -> bool:
    """The node runs *instance_id* again with every (non-retired) endpoint NORMAL."""
    eps = [e for e in status.endpoints if e.status is not EndpointStatus.RETIRED]
    return (
        status.instance_id == instance_id
        and status.state in (NodeState.RUNNING, NodeState.PAUSED)
        and bool(eps)
        and all(e.status is EndpointStatus.NORMAL for e in eps)
    )


def resume_plan(
    targets: Sequence[Target], statuses: Sequence[NodeStatus], instance_id: int
) -> tuple[list[Target], list[str]]:
    """A relaunch resumed after a controller restart: (nodes to dispatch to, nodes already
    relaunching). A node that runs the instance with every endpoint NORMAL again needs nothing; one
    whose state is RELAUNCHING got the previous controller's command; every other one (its engine
    still dead: the previous controller died before dispatching) gets the command now. Nothing to
    dispatch and nothing relaunching = the relaunch finished while the controller was away."""
    todo: list[Target] = []
    relaunching: list[str] = []
    for t, st in zip(targets, statuses, strict=True):
        if st.state is NodeState.RELAUNCHING:
            relaunching.append(t.node_id)
        elif not relaunch_complete(st, instance_id):
            todo.append(t)
    return todo, relaunching


def abort_targets(targets: Sequence[Target], dispatched: Iterable[str]) -> list[Target]:
    """Phase 2: only nodemanagers whose restart was not dispatched get an abort."""
    done = set(dispatched)
    return [t for t in targets if t.node_id not in done]


def unreachable_exceeded(misses: dict[str, int], threshold: int) -> list[str]:
    return sorted(n for n, k in misses.items() if k >= threshold)


# --- the strategy ----------------------------------------------------------------------------------
class EngineRelaunch:
    name = ENGINE_RELAUNCH

    def __init__(
        self,
        node_managers: NodeManagers,
        config: FaultToleranceConfig,
        targets: Sequence[Target],
        progress: Progress,
        *,
        deleted: Callable[[int], bool],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        call_margin: float = 5.0,
        resumed: bool = False,
    ) -> None:
        # Resumed by a controller that restarted mid-relaunch: the previous one may have dispatched
        # to some or all nodes already (see resume_plan).
        self.resumed = resumed
        self._nms = node_managers
        self._margin = call_margin
        self._deadline = 0.0
        self._cfg = config
        self.targets = list(targets)
        self.progress = progress
        self._deleted = deleted
        self._spawn = spawn
        self._clock = clock
        self._sleep = sleep
        self._task: asyncio.Task[Any] | None = None
        self.dispatched: set[str] = set()
        self.aborted: list[str] = []

    def _phase(self, phase: str) -> None:
        self.progress.phase = phase
        log.info("engine relaunch: %s", phase, extra={"nodes": [t.node_id for t in self.targets]})

    async def run(self, instance: ManagedInstance) -> StrategyResult:
        self._task = asyncio.current_task()
        try:
            return await self._run(instance)
        except asyncio.CancelledError:
            self._spawn(self._abort_all(instance.id))
            raise

    async def _run(self, mi: ManagedInstance) -> StrategyResult:
        # phase 1: probe every nodemanager
        self._phase("probe")
        probes = await asyncio.gather(*(self._nms.get_status(t.address) for t in self.targets), return_exceptions=True)
        down = [t.node_id for t, r in zip(self.targets, probes, strict=True) if isinstance(r, BaseException)]
        if down:
            return await self._phase2(mi, f"nodemanagers unreachable: {', '.join(down)}")
        if self._deleted(mi.id):
            return StrategyResult(Outcome.ABORTED, "instance deleted")
        todo = list(self.targets)
        if self.resumed:
            statuses = [r for r in probes if not isinstance(r, BaseException)]
            todo, relaunching = resume_plan(self.targets, statuses, mi.id)
            self.dispatched.update(relaunching)
            if not todo and not relaunching:
                self._phase("done")
                return StrategyResult(Outcome.DONE, "relaunched while the controller was away")
        # dispatch RestartEngine(RESTART) to all (resumed: to those not relaunching or relaunched)
        self._phase("dispatch")
        self.progress.relaunch_attempts += 1
        self._deadline = deadline = self._clock() + self._cfg.engine_relaunch_complete_timeout_sec
        results = await asyncio.gather(*(self._dispatch(t, mi.id) for t in todo))
        failed = [f"{t.node_id}: {err}" for t, err in zip(todo, results, strict=True) if err]
        if self._deleted(mi.id):
            return StrategyResult(Outcome.ABORTED, "instance deleted")
        if failed:
            return await self._phase2(mi, "restart not dispatched to " + "; ".join(failed))
        # poll until every node is NORMAL again
        self._phase("poll")
        misses = {t.node_id: 0 for t in self.targets}
        while True:
            if self._deleted(mi.id):
                return StrategyResult(Outcome.ABORTED, "instance deleted")
            polls = await asyncio.gather(*(self._nms.get_status(t.address) for t in self.targets), return_exceptions=True)
            complete = True
            for t, r in zip(self.targets, polls, strict=True):
                if isinstance(r, BaseException):
                    misses[t.node_id] += 1
                    complete = False
                else:
                    misses[t.node_id] = 0
                    complete = complete and relaunch_complete(r, mi.id)
            if complete:
                self._phase("done")
                return StrategyResult(Outcome.DONE, "all endpoints NORMAL after relaunch")
            lost = unreachable_exceeded(misses, self._cfg.engine_relaunch_nm_unreachable_threshold)
            if lost:
                return await self._phase2(mi, f"nodemanagers unreachable while relaunching: {', '.join(lost)}")
            if self._clock() >= deadline:
                return await self._phase2(
                    mi, f"engines not NORMAL within {self._cfg.engine_relaunch_complete_timeout_sec:g}s"
                )
            await self._sleep(self._cfg.engine_relaunch_poll_interval_sec)

    async def _dispatch(self, t: Target, instance_id: int) -> str:
        """'' when dispatched, else the last error."""
        err = ""
        for attempt in range(self._cfg.engine_relaunch_dispatch_retries + 1):
            try:
                timeout = dispatch_timeout(self._deadline, self._clock(), self._margin)
                await self._nms.restart_engine(t.address, instance_id, abort=False, timeout=timeout)
            except MotorError as exc:
                kind = classify_dispatch_error(exc)
                if kind is Dispatch.DISPATCHED:
                    break
                err = exc.message
                log.warning("engine restart dispatch failed",
                            extra={"node_id": t.node_id, "attempt": attempt + 1, "error": exc.message})  # fmt: skip
                if kind is Dispatch.FAILED:
                    return err
                await self._sleep(min(self._cfg.engine_relaunch_poll_interval_sec, 1.0))
                continue
            break
        else:
            return err
        self.dispatched.add(t.node_id)
        return ""

    async def _phase2(self, mi: ManagedInstance, why: str) -> StrategyResult:
        self._phase("phase2")
        self.progress.last_error = why
        log.error("engine relaunch failed, falling back to node restart: %s", why, extra={"instance_id": mi.id})
        if self._deleted(mi.id):
            return StrategyResult(Outcome.ABORTED, "instance deleted")
        targets = abort_targets(self.targets, self.dispatched)
        results = await asyncio.gather(*(self._abort(t, mi.id) for t in targets))
        self.aborted = [t.node_id for t, ok in zip(targets, results, strict=True) if ok]
        return StrategyResult(Outcome.FAILED, why)

    async def _abort(self, t: Target, instance_id: int) -> bool:
        try:
            await self._nms.restart_engine(t.address, instance_id, abort=True, timeout=self._margin)
        except MotorError as exc:
            log.error(
                "engine relaunch abort failed for nodemanager %s: %s", t.node_id, exc.message,
                extra={"node_id": t.node_id, "address": t.address},
            )  # fmt: skip
            return False
        return True

    async def _abort_all(self, instance_id: int) -> None:
        """Interrupted: unfreeze everyone (fire and forget)."""
        await asyncio.gather(*(self._abort(t, instance_id) for t in self.targets))

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
