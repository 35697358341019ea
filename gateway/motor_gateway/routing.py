"""Which coordinator gets the traffic (pure): readiness views in, one route out.

Rules, in order (``current`` makes the choice sticky so two ready coordinators never flap):

1. A **ready** coordinator (master or standalone, not isolated, something schedulable): the
   current one if it is still ready, else the first ready one in configuration order.
2. **Degraded**: nobody is ready, every *reachable* coordinator says ``store_available=false``
   (etcd is down for everyone) and one of them is master in its own view (isolated): it is the
   only one that can still hold the lock, so it keeps serving what it has. Requests carry the
   ``x-motor-degraded: 1`` hint, without which an isolated master refuses (coordinator readiness.py).
3. A reachable **master or standalone that is not isolated** but has nothing schedulable: route to
   it anyway so the client gets its precise error (NO_SCHEDULABLE_INSTANCE, MODEL_NOT_FOUND).
4. Otherwise **no route** (failover in progress): callers wait a bounded time for one.

An isolated coordinator is never chosen while any coordinator reaches the store (its network is
cut, or a standby is about to take over).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from motor_common.leadership import LeaderRole

UNREACHABLE = "coordinator unreachable"
NO_MASTER = "no master coordinator"


@dataclass(frozen=True)
class CoordinatorView:
    address: str
    reachable: bool
    ready: bool = False
    reason: str = UNREACHABLE
    # None: unknown (unreachable, or a coordinator that does not report its role).
    role: LeaderRole | None = None
    isolated: bool = False
    store_available: bool = True


@dataclass(frozen=True)
class Route:
    address: str | None
    degraded: bool = False
    # Why there is no route / why the route is degraded / why the chosen one is not ready.
    reason: str = ""
    ready: bool = False


def choose(views: Sequence[CoordinatorView], current: str | None = None) -> Route:
    ready = [v for v in views if v.reachable and v.ready]
    if ready:
        pick = next((v for v in ready if v.address == current), ready[0])
        return Route(pick.address, ready=True, reason="ok")
    reachable = [v for v in views if v.reachable]
    isolated_masters = [v for v in reachable if v.role is LeaderRole.MASTER and v.isolated]
    if reachable and isolated_masters and not any(v.store_available for v in reachable):
        pick = next((v for v in isolated_masters if v.address == current), isolated_masters[0])
        return Route(pick.address, degraded=True, ready=True,
                     reason="degraded: the election store is unreachable; the isolated master serves")
    masters = [v for v in reachable
               if v.role in (LeaderRole.MASTER, LeaderRole.STANDALONE) and not v.isolated]
    if masters:
        pick = next((v for v in masters if v.address == current), masters[0])
        return Route(pick.address, reason=pick.reason)
    # By position in the gateway's `coordinators` list, not address: the reason is what the
    # unauthenticated /ready shows (the addresses are in the route-change log line).
    detail = "; ".join(f"coordinator {i}: {v.reason}" for i, v in enumerate(views, 1))
    return Route(None, reason=f"{NO_MASTER} ({detail})" if detail else NO_MASTER)


# Refusals that say "this coordinator cannot take it now, another one (or this one shortly) can".
RETRYABLE_REASONS = (None, "NOT_MASTER", "ISOLATED", "REGISTRY_NOT_SYNCED")


# gRPC's own failures of a call (no ErrorInfo: the coordinator's own errors always carry one): a
# connect error or a reset is UNAVAILABLE; a coordinator killed while it held the call also shows as
# INTERNAL ("Internal error from Core") or UNKNOWN ("Stream removed").
BROKEN_CALL_CODES = ("UNAVAILABLE", "INTERNAL", "UNKNOWN")


def broken_call(code: str, reason: str | None) -> bool:
    """The call broke in gRPC itself (the coordinator unreachable, or gone while it held the call)."""
    return reason is None and code in BROKEN_CALL_CODES


def retryable(code: str, reason: str | None) -> bool:
    """A Dispatch that failed *before its head* may be sent again to the (new) master when the
    call broke in gRPC itself (connect error, reset, the coordinator killed while it held the
    call), or the coordinator refused it because it is not, or no longer, the serving master, or
    has not received its instance set yet (just restarted and elected before the controller's
    next sync: a synced peer, or this one in a moment, can serve it)."""
    return broken_call(code, reason) or (code == "UNAVAILABLE" and reason in RETRYABLE_REASONS)
