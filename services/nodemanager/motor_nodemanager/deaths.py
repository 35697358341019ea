"""Engine death reports to the controller: two signals, deduplicated, retried, then freeze.

Signals (SPEC §4.3, seed "引擎死亡双信号源"):

- **process exit** (pid watcher): one report per pid, however often the exit is observed;
- **health ABNORMAL** of an endpoint that was once NORMAL: one report per endpoint until it is
  NORMAL again (recovery clears it), so a flapping probe does not flood the controller.

:class:`DeathLedger` is the pure dedup bookkeeping. :class:`DeathReporter` sends a report with
``ControllerService.ReportFault``; a failed report is retried in the background every
``retry_interval`` until the controller accepts it or the report is withdrawn (the endpoint
recovered or was relaunched); one the controller refuses as INVALID_ARGUMENT is given up (logged
as an error), since the same request would be refused forever. Only an *accepted* report with
``relaunch_expected`` may freeze the arbiter (and only with ``enable_engine_relaunch`` on): when the
controller is unreachable or refuses the report nothing freezes and self-termination keeps
counting, so the node-restart fallback is never delayed.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from motor_common.errors import InvalidArgument, MotorError
from motor_common.logs import request_id_var
from motor_common.tasks import TaskOwner
from motor_nodemanager.controller_client import FaultAck, FaultReport, FaultSource

log = logging.getLogger(__name__)

ReportFn = Callable[[FaultReport], Awaitable[FaultAck]]


class _Outcome(enum.Enum):
    ACCEPTED = "accepted"
    RETRY = "retry"  # the controller was unreachable or did not accept it: try again later
    REFUSED = "refused"  # INVALID_ARGUMENT: the same request would be refused again


def report_key(report: FaultReport) -> tuple[str, int]:
    """Dedup key: a process exit is identified by its pid, anything else by its endpoint."""
    if report.source is FaultSource.PROCESS_EXIT:
        return ("pid", report.pid)
    return (report.source.name.lower(), report.endpoint_id)


@dataclass
class DeathLedger:
    """What has already been reported (pure)."""

    pids: set[int] = field(default_factory=set)
    endpoints: set[tuple[str, int]] = field(default_factory=set)

    def is_duplicate(self, report: FaultReport) -> bool:
        kind, value = report_key(report)
        return value in self.pids if kind == "pid" else (kind, value) in self.endpoints

    def claim(self, report: FaultReport) -> bool:
        """True the first time *report*'s key is seen (it must be sent); False for a duplicate."""
        kind, value = report_key(report)
        if kind == "pid":
            if value in self.pids:
                return False
            self.pids.add(value)
            return True
        if (kind, value) in self.endpoints:
            return False
        self.endpoints.add((kind, value))
        return True

    def recovered(self, endpoint_id: int) -> list[tuple[str, int]]:
        """The endpoint is NORMAL again: its per-endpoint reports may be sent again."""
        gone = [k for k in self.endpoints if k[1] == endpoint_id]
        self.endpoints.difference_update(gone)
        return gone

    def reset_endpoints(self) -> None:
        """Engines relaunched: per-endpoint state starts over (pids stay: they never come back)."""
        self.endpoints.clear()


class DeathReporter:
    def __init__(
        self,
        send: ReportFn,
        on_accepted: Callable[[FaultReport, FaultAck], None],
        retry_interval: Callable[[], float],
    ) -> None:
        self._send = send
        self._on_accepted = on_accepted
        self._retry_interval = retry_interval
        self.ledger = DeathLedger()
        self._retries: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._tasks = TaskOwner("death-reports")
        self.sent = 0
        self.accepted = 0
        self.refused = 0  # refused INVALID_ARGUMENT: given up

    async def report(self, report: FaultReport) -> bool:
        """Send *report* once (deduplicated); on failure keep retrying in the background.

        Returns True when this first attempt was accepted."""
        if not self.ledger.claim(report):
            log.info("duplicate fault report suppressed", extra={"key": str(report_key(report))})
            return False
        outcome = await self._attempt(report)
        if outcome is not _Outcome.RETRY:
            return outcome is _Outcome.ACCEPTED
        key = report_key(report)
        self._retries[key] = self._tasks.spawn(self._retry(report), name=f"fault-retry-{key[0]}-{key[1]}")
        return False

    async def _attempt(self, report: FaultReport) -> _Outcome:
        self.sent += 1
        try:
            ack = await self._send(report)
        except InvalidArgument as exc:
            # The controller refused the request itself: the same report would be refused again.
            # Self-termination keeps counting, as when the controller is unreachable.
            self.refused += 1
            log.error(
                "fault report refused by the controller, not retried: %s",
                exc.message,
                extra={"endpoint_id": report.endpoint_id, "pid": report.pid, "source": report.source.name,
                       "reason": exc.reason},
            )  # fmt: skip
            return _Outcome.REFUSED
        except MotorError as exc:
            log.warning(
                "fault report failed, will retry: %s",
                exc.message,
                extra={"endpoint_id": report.endpoint_id, "pid": report.pid, "source": report.source.name},
            )
            return _Outcome.RETRY
        if not ack.accepted:
            log.warning("fault report not accepted by the controller, will retry",
                        extra={"endpoint_id": report.endpoint_id})  # fmt: skip
            return _Outcome.RETRY
        self.accepted += 1
        log.warning(
            "engine fault reported",
            extra={"endpoint_id": report.endpoint_id, "pid": report.pid, "level": report.level.name,
                   "source": report.source.name, "relaunch_expected": ack.relaunch_expected,
                   "detail": report.detail},
        )  # fmt: skip
        self._on_accepted(report, ack)
        return _Outcome.ACCEPTED

    async def _retry(self, report: FaultReport) -> None:
        request_id_var.set("")
        key = report_key(report)
        try:
            while True:
                await asyncio.sleep(self._retry_interval())
                if await self._attempt(report) is not _Outcome.RETRY:
                    return
        finally:
            if self._retries.get(key) is asyncio.current_task():
                del self._retries[key]

    def withdraw(self, endpoint_id: int) -> None:
        """The endpoint recovered: stop retrying its reports and allow new ones."""
        for key in self.ledger.recovered(endpoint_id):
            task = self._retries.pop(key, None)
            if task is not None:
                task.cancel()

    def reset(self) -> None:
        """Engines relaunched: pending retries describe processes that are gone."""
        for task in self._retries.values():
            task.cancel()
        self._retries.clear()
        self.ledger.reset_endpoints()

    @property
    def pending(self) -> int:
        return len(self._retries)

    async def close(self) -> None:
        self._retries.clear()
        await self._tasks.close()
