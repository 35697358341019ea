"""DP scale-down on the controller: eligibility, the transaction state machine and its persisted
record. Pure, no I/O (the strategy in ``strategies/dp_scale_down.py`` does the calls).

    phase \\ event    OK            FAIL/DEADLINE   RESTARTED (controller restarted mid-transaction)
    GUARDING         AWAIT_UNHEALTHY  ABORTING     ABORTING   (apply never sent)
    AWAIT_UNHEALTHY  WITHDRAWN        ABORTING     ABORTING
    WITHDRAWN        APPLYING         ABORTING     ABORTING
    APPLYING         POLLING          ABORTING     POLLING    (apply may have been sent: never replay it)
    POLLING          COMMITTING       ABORTING     POLLING
    COMMITTING       COMMITTED        ABORTING     COMMITTING (finalize(commit) is idempotent)
    ABORTING         ABORTED          ABORTED      ABORTING
    COMMITTED / ABORTED: terminal

APPLYING is persisted **before** the one ``apply`` goes out, so a restarted controller can never
tell "not sent" from "sent" and therefore never sends it again: it keeps polling the survivors until
the execution deadline (a fresh deadline from the restart) and commits or aborts.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from motor_common.domain import Instance


class Phase(enum.Enum):
    GUARDING = "guarding"
    AWAIT_UNHEALTHY = "await_unhealthy"
    WITHDRAWN = "withdrawn"
    APPLYING = "applying"
    POLLING = "polling"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ABORTING = "aborting"
    ABORTED = "aborted"


class Event(enum.Enum):
    OK = "ok"
    FAIL = "fail"
    RESTARTED = "restarted"


_P, _E = Phase, Event
TRANSITIONS: dict[tuple[Phase, Event], Phase] = {
    (_P.GUARDING, _E.OK): _P.AWAIT_UNHEALTHY,
    (_P.AWAIT_UNHEALTHY, _E.OK): _P.WITHDRAWN,
    (_P.WITHDRAWN, _E.OK): _P.APPLYING,
    (_P.APPLYING, _E.OK): _P.POLLING,
    (_P.POLLING, _E.OK): _P.COMMITTING,
    (_P.COMMITTING, _E.OK): _P.COMMITTED,
    (_P.ABORTING, _E.OK): _P.ABORTED,
    (_P.ABORTING, _E.FAIL): _P.ABORTED,
    **{(p, _E.FAIL): _P.ABORTING for p in (_P.GUARDING, _P.AWAIT_UNHEALTHY, _P.WITHDRAWN, _P.APPLYING,
                                          _P.POLLING, _P.COMMITTING)},
    (_P.GUARDING, _E.RESTARTED): _P.ABORTING,
    (_P.AWAIT_UNHEALTHY, _E.RESTARTED): _P.ABORTING,
    (_P.WITHDRAWN, _E.RESTARTED): _P.ABORTING,
    (_P.APPLYING, _E.RESTARTED): _P.POLLING,
    (_P.POLLING, _E.RESTARTED): _P.POLLING,
    (_P.COMMITTING, _E.RESTARTED): _P.COMMITTING,
    (_P.ABORTING, _E.RESTARTED): _P.ABORTING,
}
TERMINAL = frozenset({Phase.COMMITTED, Phase.ABORTED})


class TransitionError(ValueError):
    pass


@dataclass(frozen=True)
class Record:
    """What is persisted (store key ``scaledown/<instance id>``)."""

    instance_id: int
    request_id: str
    phase: Phase
    original_dp_ranks: tuple[int, ...]
    dead_ranks: tuple[int, ...]  # ranks this transaction removes
    committed_dead_ranks: tuple[int, ...] = ()  # cumulative, over every committed transaction
    fallback_strategy: str = "engine_relaunch"
    last_error: str = ""

    @property
    def in_flight(self) -> bool:
        return self.phase not in TERMINAL

    @property
    def withdrawn(self) -> tuple[int, ...]:
        """Ranks coordinators must not see in this phase."""
        if self.phase in (Phase.WITHDRAWN, Phase.APPLYING, Phase.POLLING, Phase.COMMITTING):
            return tuple(sorted(set(self.committed_dead_ranks) | set(self.dead_ranks)))
        return self.committed_dead_ranks


def advance(rec: Record, event: Event, error: str = "") -> Record:
    """The only place a transaction changes phase."""
    nxt = TRANSITIONS.get((rec.phase, event))
    if nxt is None:
        raise TransitionError(f"scale-down {rec.request_id}: no transition from {rec.phase.value} on {event.value}")
    committed = rec.committed_dead_ranks
    if nxt is Phase.COMMITTED:
        committed = tuple(sorted(set(committed) | set(rec.dead_ranks)))
    return replace(rec, phase=nxt, committed_dead_ranks=committed, last_error=error or rec.last_error)


def encode(rec: Record) -> bytes:
    return orjson.dumps({**rec.__dict__, "phase": rec.phase.value})


def decode(raw: bytes) -> Record:
    d: dict[str, Any] = orjson.loads(raw)
    return Record(
        instance_id=int(d["instance_id"]),
        request_id=str(d["request_id"]),
        phase=Phase(d["phase"]),
        original_dp_ranks=tuple(d["original_dp_ranks"]),
        dead_ranks=tuple(d["dead_ranks"]),
        committed_dead_ranks=tuple(d.get("committed_dead_ranks", ())),
        fallback_strategy=str(d.get("fallback_strategy", "engine_relaunch")),
        last_error=str(d.get("last_error", "")),
    )


# --- decisions ---------------------------------------------------------------------------------------
def dead_rank_of(instance: Instance, node_id: str, endpoint_id: int) -> int | None:
    for e in instance.endpoints:
        if e.node_id == node_id and e.id == endpoint_id:
            return e.dp_rank
    return None


def eligible(
    *,
    enabled: bool,
    instance: Instance | None,
    node_capable: Sequence[bool],
    dead_ranks: Iterable[int],
    retired: Iterable[int] = (),
) -> tuple[bool, str]:
    """Whether an ENGINE_DEAD of *dead_ranks* is handled by a DP scale-down (else: engine relaunch).

    Needs the feature on, an instance with data parallelism (≥ 2 DP ranks: the MoE/EP deployments
    that support it; Motor cannot see "MoE" itself), every node declaring ``dp_scale_down``, a known
    dead rank and at least one survivor."""
    if not enabled:
        return False, "enable_dp_scale_down is off"
    if instance is None:
        return False, "instance not assembled"
    ranks = {e.dp_rank for e in instance.endpoints} - set(retired)
    dead = set(dead_ranks)
    if len(ranks) < 2:
        return False, "not a data-parallel instance"
    if not node_capable or not all(node_capable):
        return False, "not every node declares the dp_scale_down capability"
    if not dead or not dead <= ranks:
        return False, "dead rank unknown"
    if not ranks - dead:
        return False, "no surviving rank"
    return True, "ok"


class Survivors(enum.Enum):
    ALL_UNHEALTHY = "all_unhealthy"
    ALL_HEALTHY = "all_healthy"
    WAITING = "waiting"


def survivors(states: Sequence[str | None]) -> Survivors:
    """Aggregate the nodes' ``ScaleDownState`` names (None = unreachable)."""
    if states and all(s == "unhealthy" for s in states):
        return Survivors.ALL_UNHEALTHY
    if states and all(s == "healthy" for s in states):
        return Survivors.ALL_HEALTHY
    return Survivors.WAITING


def visible(instance: Instance, withdrawn: Iterable[int]) -> Instance:
    """The instance as coordinators see it: without the withdrawn DP ranks."""
    gone = set(withdrawn)
    if not gone:
        return instance
    return replace(instance, endpoints=tuple(e for e in instance.endpoints if e.dp_rank not in gone))
