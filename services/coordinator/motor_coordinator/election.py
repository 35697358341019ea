"""The coordinator's :class:`~motor_coordinator.leadership.Leadership` over an etcd lease.

A thin adapter around ``motor_common.etcd_election.EtcdElection`` (the election driver and its
pure state machine live in ``motor_common``). Reads are time-aware (``EtcdElection.current``):
a master whose renewal is overdue reads as isolated at once. Subscribers are told about every
change; promotion and loss are reported separately (announcement to the controller, Kubernetes
exit).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from motor_common import leadership as lship
from motor_common.etcd_election import EtcdElection
from motor_common.leadership import LeaderRole
from motor_common.leadership import Leadership as View
from motor_coordinator.config import CoordinatorConfig

log = logging.getLogger(__name__)


class EtcdLeadership:
    def __init__(self, cfg: CoordinatorConfig) -> None:
        ttl, check, notes = lship.clamp(cfg.master_lock_ttl, cfg.master_standby_check_interval)
        for note in notes:
            log.warning(note)
        self.ttl, self.check_interval = ttl, check
        self._cfg = cfg
        self._election: EtcdElection | None = None
        self._last: View = lship.initial_candidate()
        self._subscribers: list[Callable[[], None]] = []
        self._promoted: list[Callable[[View], None]] = []
        self._demoted: list[Callable[[View], None]] = []
        # Set when a master lost the lock (lease gone or another holder seen).
        self.lost = asyncio.Event()

    # -- Leadership Protocol -------------------------------------------------------------------

    @property
    def view(self) -> View:
        return self._election.current() if self._election is not None else self._last

    @property
    def role(self) -> LeaderRole:
        return self.view.role

    @property
    def is_master(self) -> bool:
        return self.view.role is LeaderRole.MASTER

    @property
    def isolated(self) -> bool:
        return self.view.isolated

    @property
    def store_available(self) -> bool:
        return self.view.store_available

    @property
    def holder(self) -> str:
        return self.view.holder

    @property
    def valid_until(self) -> float:
        """Monotonic time until which this master's lease surely holds (0: not master)."""
        e = self._election
        return e.valid_until if e is not None and e.view.role is LeaderRole.MASTER else 0.0

    @property
    def holding_back(self) -> str:
        """Why this coordinator left a free master lock alone at its last check ("" = it did not)."""
        return self._election.holding_back if self._election is not None else ""

    def subscribe(self, on_change: Callable[[], None]) -> None:
        self._subscribers.append(on_change)

    # -- promotion / loss hooks ----------------------------------------------------------------

    def on_promoted(self, callback: Callable[[View], None]) -> None:
        self._promoted.append(callback)

    def on_demoted(self, callback: Callable[[View], None]) -> None:
        self._demoted.append(callback)

    def _changed(self, view: View) -> None:
        prev, self._last = self._last, view
        for cb in self._subscribers:
            cb()
        if view.role is LeaderRole.MASTER and (prev.role is not LeaderRole.MASTER or view.term != prev.term):
            log.warning("promoted to master", extra={"term": view.term})
            for promoted in self._promoted:
                promoted(view)
        elif prev.role is LeaderRole.MASTER and view.role is not LeaderRole.MASTER:
            log.error("lost the master lock", extra={"holder": view.holder})
            self.lost.set()
            for demoted in self._demoted:
                demoted(view)

    def _validity_moved(self) -> None:
        # The view is unchanged but its validity bound moved: the front workers need the new one.
        for cb in self._subscribers:
            cb()

    # -- life cycle ----------------------------------------------------------------------------

    async def start(self, candidate: str, may_acquire: Callable[[], str | None] | None = None) -> None:
        """Campaign as *candidate*; *may_acquire* (None = go ahead, else why not yet) is asked
        before taking a free lock."""
        ha = self._cfg.ha
        self._election = EtcdElection(
            list(ha.etcd_endpoints), ha.election_key, candidate,
            ttl=self.ttl, check_interval=self.check_interval,
            on_change=self._changed, call_timeout=ha.etcd_call_timeout_sec, may_acquire=may_acquire,
            on_validity=self._validity_moved,
        )
        log.info("campaigning", extra={"candidate": candidate, "key": ha.election_key,
                                       "ttl": self.ttl, "check_interval": self.check_interval})
        await self._election.start()

    async def stop(self) -> None:
        """Resign: a master revokes its lease so a standby takes over within its check interval."""
        if self._election is not None:
            await self._election.stop(resign=True)
            self._last = self._election.view
            self._election = None
            for cb in self._subscribers:
                cb()
