"""DP scale-down (ENGINE_DEAD on a data-parallel MoE/EP instance, ``enable_dp_scale_down``).

guard(request id, lease) on every nodemanager → wait until the survivors report UNHEALTHY (they noticed
the dead rank) → withdraw the dead ranks from what coordinators see (the instance record's
``withdrawn_dp_ranks``; the level-triggered push plan then sends the instance without those endpoints)
→ one ``apply`` → poll until every node reports HEALTHY → ``finalize(commit)`` → DONE. Anything else
(a refused call, the ``execution_deadline_sec`` passing, the instance deleted) → ``finalize(abort)``,
the withdrawn ranks are restored, result FAILED: the fault manager escalates at once to the fallback
strategy (engine relaunch), inside the same recovery.

Every phase change is persisted (:mod:`motor_controller.scale_down`) before the step it names. A
restarted controller resumes a record (``resume=``) through the RESTARTED transition: before apply →
abort; at or after apply → keep polling (never a second apply); committing → commit again. Cancelled
(controller shutdown): nothing is sent — the record stays for the next controller.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from motor_common.errors import MotorError
from motor_controller.config import FaultToleranceConfig
from motor_controller.fault_policy import (
    DP_SCALE_DOWN,
    ENGINE_RELAUNCH,
    Outcome,
    Progress,
    StrategyResult,
)
from motor_controller.model import ManagedInstance
from motor_controller.scale_down import Event, Phase, Record, Survivors, advance, survivors

log = logging.getLogger(__name__)


class ScaleDownPeers(Protocol):
    async def guard(self, address: str, request_id: str, instance_id: int, lease_sec: float,
                    dead_ranks: Sequence[int], *, timeout: float) -> None: ...  # fmt: skip
    async def apply(self, address: str, request_id: str, instance_id: int, dead_ranks: Sequence[int], *,
                    timeout: float) -> None: ...  # fmt: skip
    async def finalize(self, address: str, request_id: str, instance_id: int, *, commit: bool,
                       timeout: float) -> list[int]: ...  # fmt: skip
    async def status(self, address: str, *, timeout: float) -> str:
        """The node's ScaleDownState as a lower-case name (``unhealthy``, ``healthy``, ...)."""
        ...


@dataclass(frozen=True)
class Target:
    node_id: str
    address: str


class _Abort(Exception):
    pass


class DpScaleDown:
    name = DP_SCALE_DOWN

    def __init__(
        self,
        peers: ScaleDownPeers,
        config: FaultToleranceConfig,
        targets: Sequence[Target],
        progress: Progress,
        *,
        dead_ranks: Sequence[int],
        save: Callable[[Record], Awaitable[None]],
        deleted: Callable[[int], bool],
        committed: Sequence[int] = (),
        resume: Record | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._peers = peers
        self._cfg = config.dp_scale_down_config
        self._fallback = ENGINE_RELAUNCH
        self.targets = list(targets)
        self.progress = progress
        self._dead = tuple(sorted(set(dead_ranks)))
        self._committed = tuple(committed)
        self._save = save
        self._deleted = deleted
        self._resume = resume
        self._clock = clock
        self._sleep = sleep
        self._task: asyncio.Task[Any] | None = None
        self.record: Record | None = None
        self.applies_sent = 0

    async def _to(self, event: Event, error: str = "") -> Record:
        assert self.record is not None
        self.record = advance(self.record, event, error)
        self.progress.phase = self.record.phase.value
        await self._save(self.record)
        log.warning("dp scale-down %s: %s", self.record.request_id, self.record.phase.value,
                    extra={"instance_id": self.record.instance_id, "dead_ranks": list(self.record.dead_ranks)})  # fmt: skip
        return self.record

    async def run(self, instance: ManagedInstance) -> StrategyResult:
        self._task = asyncio.current_task()
        deadline = self._clock() + self._cfg.execution_deadline_sec
        try:
            if self._resume is not None:
                self.record = self._resume
                await self._to(Event.RESTARTED)
            else:
                assert instance.instance is not None
                original = tuple(sorted(e.dp_rank for e in instance.instance.endpoints))
                self.record = Record(instance.id, f"sd-{instance.id}-{uuid.uuid4().hex[:12]}", Phase.GUARDING,
                                     original, self._dead, self._committed, self._fallback)  # fmt: skip
                self.progress.phase = Phase.GUARDING.value
                await self._save(self.record)
            return await self._drive(instance.id, deadline)
        except _Abort as exc:
            return await self._abort(instance.id, str(exc))

    async def _drive(self, iid: int, deadline: float) -> StrategyResult:
        assert self.record is not None
        rec = self.record
        if rec.phase is Phase.GUARDING:
            lease = self._cfg.execution_deadline_sec + self._cfg.request_timeout_sec
            await self._all("guard", lambda t: self._peers.guard(t.address, rec.request_id, iid, lease, rec.dead_ranks,
                                                                 timeout=self._cfg.request_timeout_sec))  # fmt: skip
            rec = await self._to(Event.OK)
        if rec.phase is Phase.AWAIT_UNHEALTHY:
            await self._wait_for(Survivors.ALL_UNHEALTHY, iid, deadline)
            rec = await self._to(Event.OK)  # → WITHDRAWN (persisted with the instance's withdrawn ranks)
        if rec.phase is Phase.WITHDRAWN:
            rec = await self._to(Event.OK)  # → APPLYING, persisted before the one apply goes out
            self.applies_sent += 1
            await self._all("apply", lambda t: self._peers.apply(t.address, rec.request_id, iid, rec.dead_ranks,
                                                                 timeout=self._cfg.request_timeout_sec))  # fmt: skip
            rec = await self._to(Event.OK)
        if rec.phase is Phase.POLLING:
            await self._wait_for(Survivors.ALL_HEALTHY, iid, deadline)
            rec = await self._to(Event.OK)
        if rec.phase is Phase.COMMITTING:
            await self._all("commit", lambda t: self._finalize(t, commit=True))
            rec = await self._to(Event.OK)
            return StrategyResult(Outcome.DONE, f"DP ranks {list(rec.dead_ranks)} retired; serving on the survivors")
        if rec.phase is Phase.ABORTING:
            return await self._abort(iid, rec.last_error or "recovered an aborting transaction")
        return StrategyResult(Outcome.FAILED, f"scale-down {rec.request_id} ended {rec.phase.value}")

    async def _finalize(self, t: Target, *, commit: bool) -> None:
        assert self.record is not None
        await self._peers.finalize(t.address, self.record.request_id, self.record.instance_id, commit=commit,
                                   timeout=self._cfg.request_timeout_sec)  # fmt: skip

    async def _all(self, what: str, call: Callable[[Target], Awaitable[None]]) -> None:
        results = await asyncio.gather(*(call(t) for t in self.targets), return_exceptions=True)
        errors = [f"{t.node_id}: {r.message if isinstance(r, MotorError) else r!r}"
                  for t, r in zip(self.targets, results, strict=True) if isinstance(r, BaseException)]  # fmt: skip
        if errors:
            raise _Abort(f"{what} failed: " + "; ".join(errors))

    async def _wait_for(self, want: Survivors, iid: int, deadline: float) -> None:
        while True:
            if self._deleted(iid):
                raise _Abort("instance deleted")
            got = await asyncio.gather(*(self._peers.status(t.address, timeout=self._cfg.request_timeout_sec)
                                         for t in self.targets), return_exceptions=True)  # fmt: skip
            states = [None if isinstance(s, BaseException) else s for s in got]
            if survivors(states) is want:
                return
            if self._clock() >= deadline:
                raise _Abort(f"survivors not {want.value} within execution_deadline_sec "
                             f"{self._cfg.execution_deadline_sec:g}s (last: {states})")  # fmt: skip
            await self._sleep(self._cfg.poll_interval_sec)

    async def _abort(self, iid: int, why: str) -> StrategyResult:
        assert self.record is not None
        log.error("dp scale-down aborted: %s", why, extra={"instance_id": iid})
        self.progress.last_error = why
        if self.record.phase is not Phase.ABORTING:
            await self._to(Event.FAIL, why)  # → ABORTING: coordinators see the dead ranks again (paused)
        results = await asyncio.gather(*(self._finalize(t, commit=False) for t in self.targets), return_exceptions=True)
        for t, r in zip(self.targets, results, strict=True):
            if isinstance(r, BaseException):  # stale/unknown there, or unreachable: its lease reverts it
                log.warning("scale-down abort not confirmed by %s: %s", t.node_id, r)
        await self._to(Event.OK)
        if self._deleted(iid):
            return StrategyResult(Outcome.ABORTED, "instance deleted")
        return StrategyResult(Outcome.FAILED, f"dp scale-down aborted ({why}); fallback: {self.record.fallback_strategy}")

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
