"""Controller election: with the etcd store, only the holder of ``ha.election_key`` acts.

:class:`ControllerLeader` turns the election's :class:`~motor_common.leadership.Leadership` view
(``motor_common.etcd_election.EtcdElection``, the same driver the coordinators use, on a distinct
key) into the controller's mode:

    serving (master, not isolated) ── load the whole state from the store, start the reconcile
                                      loop, pushers and fault manager; gRPC health SERVING
    anything else (standby, isolated master: etcd unreachable or lease overdue)
                                   ── pause the background work (engines, coordinators and the
                                      in-memory state are left as they are); health NOT_SERVING;
                                      mutating RPCs refused with UNAVAILABLE reason NOT_MASTER

The load runs inside the election's callback, when no renewal can run. If the lease may have
lapsed meanwhile (the election's view *now* is isolated), the controller does not start: the next
renewal either confirms the lease, and the controller loads again and acts, or loses it.

Every promotion reloads from the store, so a controller that takes over (or comes back after an
etcd outage) resumes exactly like a restarted one: heartbeats re-attach nodes to their persisted
instances and no healthy engine is relaunched. Writes are fenced on the election key
(``EtcdStore(fence=…)``), so a deposed master that resumes cannot overwrite the new master's state.

The store's reachability (the election's renewals and every store call) is mirrored as a
``STORE_UNAVAILABLE`` alarm in the controller's alarm store (memory only: the store is down).

A load that fails for any other reason (a record this version cannot decode, a bug) is not retried
while holding the lock: the controller raises ``STATE_LOAD_FAILED`` (naming the cause, in its own
memory), steps down (:class:`~motor_common.etcd_election.StepDown`: the lease is revoked, so
another candidate, perhaps of the version that wrote the record, can take over at once) and holds
back from the free lock for 2 s, doubling up to 60 s, before it tries again. Its readiness says
why. The alarm clears with the next load that succeeds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from motor_common.errors import MotorError, Unavailable
from motor_common.etcd_election import StepDown
from motor_common.leadership import LeaderRole, Leadership
from motor_controller.alarms import Alarm, AlarmAction, AlarmKind
from motor_controller.controller import Controller

log = logging.getLogger(__name__)

# After a failed state load: leave a free lock to the other candidates this long, doubling per
# failure in a row.
LOAD_RETRY_FIRST_SEC = 2.0
LOAD_RETRY_MAX_SEC = 60.0


class Health(Protocol):
    async def set_serving(self, serving: bool, service: str | None = None) -> None: ...


class ControllerLeader:
    def __init__(self, controller: Controller, health: Health, source: str,
                 wall: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.controller = controller
        self.health = health
        self.source = source  # alarm source, e.g. "controller@10.0.0.10:9200"
        self.view = Leadership(LeaderRole.STANDBY)
        self._wall = wall
        self._lock = asyncio.Lock()
        self.promotions = 0
        # The election's view *now* (``EtcdElection.current``: a master whose renewal is overdue
        # reads as isolated). No renewal runs while this callback loads the state, so the view it
        # was called with may be stale by the time the load ends.
        self.current: Callable[[], Leadership] | None = None
        # Why the last state load failed ("" = it did not), and until when (monotonic) this
        # candidate leaves a free lock to the others.
        self.load_failure = ""
        self.load_failures = 0
        self._hold_until = 0.0
        self._mono = time.monotonic

    def may_acquire(self) -> str | None:
        """Election hook: None = take a free lock; else why not yet (after a failed load)."""
        left = self._hold_until - self._mono()
        if left > 0:
            return f"the last state load failed ({self.load_failure}); trying again in {left:.0f} s"
        return None

    def readiness(self) -> tuple[bool, str]:
        if self.controller.acting:
            return True, "ok"
        if self.load_failure:
            return False, f"cannot load the controller state: {self.load_failure}"
        return False, "controller is not master"

    def check(self) -> None:
        """Gate of mutating RPCs: only the acting master accepts them."""
        if not self.controller.acting:
            raise Unavailable("controller is not master", reason="NOT_MASTER",
                              metadata={"holder": self.view.holder})  # fmt: skip

    async def on_change(self, view: Leadership) -> None:
        """Election callback (awaited by the election loop; a failed load is retried by it)."""
        async with self._lock:
            self.view = view
            self.store_status(view.store_available, "" if view.store_available else "election renewal failed")
            if view.serving and not self.controller.acting:
                try:
                    await self.controller.load()
                except Unavailable:
                    raise  # the store is unreachable: the election isolates and retries
                except Exception as exc:
                    raise self._load_failed(exc) from exc
                self._load_ok()
                now = self.current() if self.current is not None else view
                if not now.serving:  # the lease may have lapsed during the load: a standby may act
                    log.warning("the lease may have expired while the state loaded: not acting; the next renewal "
                                "decides", extra={"role": now.role.value, "isolated": now.isolated})
                    return
                self.controller.start()
                self.promotions += 1
                await self.health.set_serving(True)
                log.info("controller is master: acting", extra={"term": view.term})
            elif not view.serving and self.controller.acting:
                await self.controller.pause()
                await self.health.set_serving(False)
                log.warning("controller stopped acting", extra={"role": view.role.value, "isolated": view.isolated,
                                                                "holder": view.holder})

    def _load_failed(self, exc: Exception) -> StepDown:
        self.load_failures += 1
        hold = min(LOAD_RETRY_MAX_SEC, LOAD_RETRY_FIRST_SEC * 2 ** (self.load_failures - 1))
        self._hold_until = self._mono() + hold
        self.load_failure = exc.message if isinstance(exc, MotorError) else f"{type(exc).__name__}: {exc}"
        log.error("the controller state cannot be loaded: not acting; handing the lock to another candidate",
                  extra={"error": self.load_failure, "failures": self.load_failures, "retry_in_sec": hold},
                  exc_info=not isinstance(exc, MotorError))  # fmt: skip
        self._report(AlarmKind.STATE_LOAD_FAILED, AlarmAction.RAISE, self.load_failure[:1024])
        return StepDown(self.load_failure)

    def _load_ok(self) -> None:
        if self.load_failure:
            log.info("the controller state loaded after %d failed attempts", self.load_failures)
            self._report(AlarmKind.STATE_LOAD_FAILED, AlarmAction.CLEAR, "state loaded")
        self.load_failure, self.load_failures, self._hold_until = "", 0, 0.0

    def _report(self, kind: AlarmKind, action: AlarmAction, message: str) -> None:
        alarm = Alarm(kind=kind, action=action, source=self.source, instance_ids=(), message=message,
                      raised_at=self._wall())  # fmt: skip
        if self.controller.alarms.report(alarm) is not None:
            (log.info if action is AlarmAction.CLEAR else log.warning)(
                "alarm %s", action.value, extra={"kind": kind.value, "source": self.source, "detail": message})

    def store_status(self, available: bool, detail: str = "") -> None:
        """Raise or clear this controller's STORE_UNAVAILABLE alarm (idempotent)."""
        self._report(AlarmKind.STORE_UNAVAILABLE, AlarmAction.CLEAR if available else AlarmAction.RAISE,
                     detail or ("store available again" if available else "store unavailable"))  # fmt: skip
