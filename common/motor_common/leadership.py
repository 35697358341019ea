"""Active/standby leadership as a pure state machine (no I/O).

An election driver (``motor_common.etcd_election``) feeds it events; readiness and routing read
the resulting :class:`Leadership` view.

    STANDALONE ── (no election configured; always serves)
    STANDBY ──acquired──▶ MASTER ──renew_failed──▶ MASTER+isolated ──renew_ok──▶ MASTER
       ▲                    │                           │
       └──────lost──────────┴──────────lost─────────────┘   (lease gone, or another holder seen)

A master turns *isolated* at the first failed renewal (unready at once), and stays master in its
own view until it learns the lease is gone: if the store itself is down nobody else can win, so
an isolated master may keep serving when no coordinator reaches the store (the gateway decides).

A master that could not even *attempt* its renewal in time (process frozen by SIGSTOP, event loop
starved) is just as isolated: :func:`at` turns a master whose renewal is overdue into an isolated
one, so a process resuming after its lease expired never reports itself ready before its first
renewal told it the lock is gone (at most one ready master, at every instant).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

# gRPC metadata a gateway adds to Dispatch when it routes to an isolated master because no
# coordinator reaches the store (degraded mode); without it an isolated master refuses.
DEGRADED_HEADER = "x-motor-degraded"


class LeaderRole(enum.Enum):
    STANDALONE = "standalone"
    MASTER = "master"
    STANDBY = "standby"


@dataclass(frozen=True)
class Leadership:
    role: LeaderRole
    isolated: bool = False
    store_available: bool = True
    # Who holds the lock, as far as we know (candidate id / address).
    holder: str = ""
    # Promotions so far (a new master announces each one).
    term: int = 0

    @property
    def serving(self) -> bool:
        """Whether this process should serve traffic and report ready."""
        return self.role in (LeaderRole.STANDALONE, LeaderRole.MASTER) and not self.isolated

    @property
    def reason(self) -> str:
        if self.role is LeaderRole.STANDBY:
            return "Coordinator is not master"
        if self.isolated:
            return "isolated"
        return ""


STANDALONE = Leadership(LeaderRole.STANDALONE)


def initial_candidate() -> Leadership:
    return Leadership(LeaderRole.STANDBY)


def acquired(view: Leadership, me: str) -> Leadership:
    return Leadership(LeaderRole.MASTER, isolated=False, store_available=True, holder=me, term=view.term + 1)


def renew_ok(view: Leadership) -> Leadership:
    return replace(view, isolated=False, store_available=True)


def renew_failed(view: Leadership) -> Leadership:
    """A renewal could not reach the store: a master isolates itself at once."""
    if view.role is LeaderRole.MASTER:
        return replace(view, isolated=True, store_available=False)
    return replace(view, store_available=False)


def lost(view: Leadership, holder: str = "") -> Leadership:
    """The lease is gone or someone else holds the lock."""
    return Leadership(LeaderRole.STANDBY, isolated=False, store_available=True, holder=holder, term=view.term)


def observed_holder(view: Leadership, holder: str) -> Leadership:
    """A standby saw the current holder (store reachable)."""
    return replace(view, holder=holder, store_available=True)


def at(view: Leadership, now: float, valid_until: float) -> Leadership:
    """The view at monotonic time *now*: a master past *valid_until* (last renewal sent + 2/3 TTL)
    is isolated even if no renewal has failed yet."""
    if view.role is LeaderRole.MASTER and not view.isolated and now > valid_until:
        return replace(view, isolated=True)
    return view


def clamp(ttl: float, check_interval: float, *, max_ttl: float = 8.0, max_check: float = 2.0) -> tuple[float, float, list[str]]:
    """Clamp the seed's limits (TTL ≤ 8 s, standby check ≤ 2 s); return notes for the log."""
    notes: list[str] = []
    if ttl > max_ttl:
        notes.append(f"master_lock_ttl {ttl} s exceeds {max_ttl} s: clamped to {max_ttl} s")
        ttl = max_ttl
    if check_interval > max_check:
        notes.append(f"master_standby_check_interval {check_interval} s exceeds {max_check} s: clamped to {max_check} s")
        check_interval = max_check
    if ttl < 2:
        notes.append(f"master_lock_ttl {ttl} s is below 2 s: raised to 2 s")
        ttl = 2.0
    return ttl, check_interval, notes
