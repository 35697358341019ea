"""Node restart: restart whole nodes through a :class:`~motor_controller.node_restarter.NodeRestarter`.

Used for a **partial node loss** (some nodes of a multi-node instance lost, others alive: the
survivors are restarted so the instance is rescheduled whole) and as the escalation after a failed
engine relaunch. The strategy asks for every restart, then waits (bounded) until every restarted
node is gone — stopping or no longer heartbeating — so the reconcile loop does not see the same
partial loss again. DONE when every restart was requested and the nodes are gone, else FAILED.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from motor_common.domain import NodeSpec
from motor_common.errors import MotorError
from motor_controller.fault_policy import NODE_RESTART, Outcome, Progress, StrategyResult
from motor_controller.model import ManagedInstance
from motor_controller.node_restarter import NodeRestarter

log = logging.getLogger(__name__)


def restart_summary(requested: Sequence[str], failed: Sequence[str], not_gone: Sequence[str]) -> StrategyResult:
    """The result of a node restart (pure)."""
    if failed:
        return StrategyResult(Outcome.FAILED, f"restart failed for {', '.join(failed)}")
    if not_gone:
        return StrategyResult(Outcome.FAILED, f"nodes still running after restart: {', '.join(not_gone)}")
    return StrategyResult(Outcome.DONE, f"restarted {', '.join(requested)}")


class NodeRestart:
    name = NODE_RESTART

    def __init__(
        self,
        restarter: NodeRestarter,
        targets: Sequence[NodeSpec],
        progress: Progress,
        *,
        reason: str,
        gone: Callable[[str], bool],
        wait_timeout: float,
        poll_interval: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._restarter = restarter
        self.targets = list(targets)
        self.progress = progress
        self._reason = reason
        self._gone = gone
        self._wait_timeout = wait_timeout
        self._poll = poll_interval
        self._clock = clock
        self._sleep = sleep
        self._task: asyncio.Task[Any] | None = None

    async def run(self, instance: ManagedInstance) -> StrategyResult:
        self._task = asyncio.current_task()
        self.progress.phase = "restart"
        names = [t.node_id for t in self.targets]
        log.warning("restarting nodes (%s): %s", self._restarter.name, self._reason,
                    extra={"instance_id": instance.id, "nodes": names})  # fmt: skip

        async def one(t: NodeSpec) -> tuple[str, str]:
            """(node id, error message or "")."""
            try:
                await self._restarter.restart(t, self._reason)
            except MotorError as exc:
                log.error("node restart failed for %s: %s", t.node_id, exc.message, extra={"node_id": t.node_id})
                return t.node_id, exc.message
            return t.node_id, ""

        results = await asyncio.gather(*(one(t) for t in self.targets))
        failed = {n: why for n, why in results if why}
        self.progress.phase = "wait"
        deadline = self._clock() + self._wait_timeout
        waiting = [n for n in names if n not in failed]
        while waiting and self._clock() < deadline:
            waiting = [n for n in waiting if not self._gone(n)]
            if waiting:
                await self._sleep(self._poll)
        # the restarter's message (e.g. the API server's RBAC denial) reaches last_error
        return restart_summary(names, [f"{n} ({why})" for n, why in failed.items()], waiting)

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
