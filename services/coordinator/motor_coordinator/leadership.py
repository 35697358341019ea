"""Who may serve: the readiness asks a :class:`Leadership`; standalone is always master.

``motor_coordinator.election.EtcdLeadership`` implements the same Protocol over the etcd lease
(SPEC §3.4) and calls the subscribers whenever it wins, loses or isolates itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from motor_common.leadership import LeaderRole

__all__ = ["LeaderRole", "Leadership", "Standalone"]


class Leadership(Protocol):
    @property
    def role(self) -> LeaderRole: ...

    @property
    def is_master(self) -> bool: ...

    @property
    def isolated(self) -> bool: ...

    @property
    def store_available(self) -> bool: ...

    @property
    def holder(self) -> str:
        """Who holds the master lock as far as this process knows ("" unknown)."""
        ...

    @property
    def valid_until(self) -> float:
        """Monotonic time after which a master must read as isolated unless it renewed (0: no
        bound). What the front workers mirror: they cannot ask the election themselves."""
        ...

    def subscribe(self, on_change: Callable[[], None]) -> None: ...


class Standalone:
    """A single coordinator with no election: always master, never isolated."""

    role = LeaderRole.STANDALONE
    is_master = True
    isolated = False
    store_available = True
    valid_until = 0.0
    holder = ""

    def subscribe(self, on_change: Callable[[], None]) -> None:
        return None


def campaign_hold(*, synced: bool, waited: float, delay: float) -> str | None:
    """Why a coordinator should not take a free master lock yet (None: take it).

    A coordinator that has not received its instance set (just started or restarted) would
    answer every request REGISTRY_NOT_SYNCED until the controller's next sync; a synced standby
    would serve at once. So an unsynced one holds back for *delay* seconds after its start
    (*waited* so far), and takes the lock after that only if nobody synced took it.
    """
    if synced or waited >= delay:
        return None
    return (f"this coordinator's instance registry is not synced yet; a synced peer may take the "
            f"lock first (this one holds back for at most {delay:g} s after its start)")
