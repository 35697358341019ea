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
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from motor_common.errors import Unavailable
from motor_common.leadership import LeaderRole, Leadership
from motor_controller.alarms import Alarm, AlarmAction, AlarmKind
from motor_controller.controller import Controller

log = logging.getLogger(__name__)


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
                await self.controller.load()
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

    def store_status(self, available: bool, detail: str = "") -> None:
        """Raise or clear this controller's STORE_UNAVAILABLE alarm (idempotent)."""
        alarm = Alarm(
            kind=AlarmKind.STORE_UNAVAILABLE,
            action=AlarmAction.CLEAR if available else AlarmAction.RAISE,
            source=self.source,
            instance_ids=(),
            message=detail or ("store available again" if available else "store unavailable"),
            raised_at=self._wall(),
        )
        if self.controller.alarms.report(alarm) is not None:
            (log.info if available else log.warning)(
                "alarm %s", alarm.action.value, extra={"kind": alarm.kind.value, "source": self.source,
                                                       "detail": alarm.message})  # fmt: skip

