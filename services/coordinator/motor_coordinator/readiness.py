"""Readiness and dispatch admission of a coordinator (pure).

Readiness (gRPC health, ``GetReadiness``, ``/ready``) asks leadership, then whether anything is
schedulable. Admission is the serve/refuse rule of ``Dispatch``:

=========================  ==============================  =====================================
own view                   request                         decision
=========================  ==============================  =====================================
standalone                 any                             serve
master, not isolated       any                             serve
master, isolated           carries the degraded hint       serve (no coordinator reaches the store)
master, isolated           no hint                         UNAVAILABLE ``ISOLATED``
standby                    any                             UNAVAILABLE ``NOT_MASTER``
=========================  ==============================  =====================================

The degraded hint is the gRPC metadata ``x-motor-degraded: 1``. The gateway sends it only when
every coordinator it reaches reports ``store_available=false`` (etcd down for everyone): then an
isolated master is the only coordinator that can still hold the lock, and it keeps serving what it
has. An isolated master reached by anyone else (its own network cut, a standby taking over) refuses.
"""

from __future__ import annotations

from dataclasses import dataclass

from motor_common.errors import Unavailable
from motor_common.leadership import DEGRADED_HEADER, LeaderRole

NO_ROUTE = "no schedulable prefill+decode pair or union instance"
NOT_SYNCED = "instance set not received yet"
NOT_MASTER = "Coordinator is not master"
ISOLATED = "isolated"
__all__ = ["DEGRADED_HEADER", "ISOLATED", "NOT_MASTER", "NOT_SYNCED", "NO_ROUTE", "Readiness", "admission", "evaluate"]


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str = ""


def evaluate(*, is_master: bool, isolated: bool, schedulable: bool, synced: bool = True) -> Readiness:
    if isolated:
        return Readiness(False, ISOLATED)
    if not is_master:
        return Readiness(False, NOT_MASTER)
    if not synced:
        return Readiness(False, NOT_SYNCED)
    if not schedulable:
        return Readiness(False, NO_ROUTE)
    return Readiness(True)


def admission(role: LeaderRole, *, isolated: bool, degraded_hint: bool, master: str = "") -> Unavailable | None:
    """``None`` = serve this Dispatch; else the error to refuse it with (see the module table).
    *master*: who holds the lock as far as this coordinator knows (its candidate id, by default its
    gRPC address; "" unknown), named in a standby's refusal as ErrorInfo metadata ``master`` only:
    the message can reach HTTP clients (a gateway passes it on), and internal addresses stay out
    of what they see."""
    if role is LeaderRole.STANDBY:
        return Unavailable(NOT_MASTER, reason="NOT_MASTER", metadata={"master": master} if master else None)
    if isolated and not degraded_hint:
        return Unavailable(
            "isolated: this master cannot renew its lease (send to the new master)", reason="ISOLATED"
        )
    return None
