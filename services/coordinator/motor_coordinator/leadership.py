"""Who may serve: the readiness asks a :class:`Leadership`; standalone is always master.

The etcd-lease implementation (SPEC §3.4) will implement the same Protocol and call
``on_change`` whenever it wins, loses or isolates itself.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol


class LeaderRole(enum.Enum):
    STANDALONE = "standalone"
    MASTER = "master"
    STANDBY = "standby"


class Leadership(Protocol):
    @property
    def role(self) -> LeaderRole: ...

    @property
    def is_master(self) -> bool: ...

    @property
    def isolated(self) -> bool: ...

    def subscribe(self, on_change: Callable[[], None]) -> None: ...


class Standalone:
    """A single coordinator with no election: always master, never isolated."""

    role = LeaderRole.STANDALONE
    is_master = True
    isolated = False

    def subscribe(self, on_change: Callable[[], None]) -> None:
        return None
