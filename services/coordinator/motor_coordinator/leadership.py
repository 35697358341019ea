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

    def subscribe(self, on_change: Callable[[], None]) -> None: ...


class Standalone:
    """A single coordinator with no election: always master, never isolated."""

    role = LeaderRole.STANDALONE
    is_master = True
    isolated = False
    store_available = True

    def subscribe(self, on_change: Callable[[], None]) -> None:
        return None
