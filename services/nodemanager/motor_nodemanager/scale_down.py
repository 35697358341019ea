"""The nodemanager side of a DP scale-down transaction: one table-driven state machine. Pure, no I/O.

The controller drives ``guard(request id, lease) → apply (once) → finalize(commit | abort)``; this
module decides what each call does to the transaction and which side effect the node must perform:

    phase \\ event (same id)  GUARD            APPLY                 COMMIT            ABORT          EXPIRE
    IDLE                      GUARDED, freeze   ABORTED (stale)       ABORTED (stale)   ABORTED        no-op
    GUARDED                   GUARDED (repeat)  APPLYING, proxy once  FAILED_PRECOND.   IDLE, revert   IDLE, revert
    APPLYING                  APPLYING (repeat) APPLYING (repeat)     IDLE, retire      IDLE, revert   IDLE, revert

- another request id while a transaction is open → ABORTED (``SCALE_DOWN_BUSY`` for a guard,
  ``SCALE_DOWN_STALE_REQUEST`` otherwise); a request id that already finished → ABORTED (stale),
  except a finalize repeating the recorded decision (idempotent: the same retired ranks);
- ``apply`` is proxied to the engines **exactly once** per request id: the transaction is APPLYING
  before the proxy call, so a retried apply (or one after a failed proxy) never reaches the engines again;
- the guard's lease runs from the guard (a repeated guard renews it); when it passes without a
  finalize the transaction reverts to IDLE (nothing retired) and the request id is finished as "expired".

:func:`reported_state` maps the phase plus what the surviving engines say about themselves
(``/fault_tolerance/status``) to the ``ScaleDownState`` the controller polls.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace


class Phase(enum.Enum):
    IDLE = "idle"
    GUARDED = "guarded"
    APPLYING = "applying"


class Event(enum.Enum):
    GUARD = "guard"
    APPLY = "apply"
    COMMIT = "commit"
    ABORT = "abort"
    EXPIRE = "expire"


class Verdict(enum.Enum):
    OK = "ok"  # transition taken
    REPEAT = "repeat"  # idempotent repeat: no side effect
    STALE = "stale"  # unknown/finished/other request id → ABORTED
    BUSY = "busy"  # another transaction holds the guard → ABORTED
    NOT_APPLIED = "not_applied"  # commit before apply → FAILED_PRECONDITION


class Effect(enum.Enum):
    NONE = "none"
    FREEZE = "freeze"  # hold self-termination until the lease deadline
    PROXY_APPLY = "proxy_apply"  # POST the scale-down to the surviving engines (once)
    RETIRE = "retire"  # mark the dead ranks RETIRED (heartbeats, polling, death reports)
    REVERT = "revert"  # nothing retired; lift the freeze


class Match(enum.Enum):
    SAME = "same"  # the open transaction's id
    OTHER = "other"  # any other id (including a finished one)


@dataclass(frozen=True)
class Rule:
    next: Phase
    verdict: Verdict
    effect: Effect = Effect.NONE


_P, _E, _M, _V, _X = Phase, Event, Match, Verdict, Effect
_OPEN = (_P.GUARDED, _P.APPLYING)
TRANSITIONS: dict[tuple[Phase, Event, Match], Rule] = {
    (_P.IDLE, _E.GUARD, _M.OTHER): Rule(_P.GUARDED, _V.OK, _X.FREEZE),
    (_P.IDLE, _E.APPLY, _M.OTHER): Rule(_P.IDLE, _V.STALE),
    (_P.IDLE, _E.COMMIT, _M.OTHER): Rule(_P.IDLE, _V.STALE),
    (_P.IDLE, _E.ABORT, _M.OTHER): Rule(_P.IDLE, _V.STALE),
    (_P.GUARDED, _E.GUARD, _M.SAME): Rule(_P.GUARDED, _V.REPEAT, _X.FREEZE),
    (_P.GUARDED, _E.APPLY, _M.SAME): Rule(_P.APPLYING, _V.OK, _X.PROXY_APPLY),
    (_P.GUARDED, _E.COMMIT, _M.SAME): Rule(_P.GUARDED, _V.NOT_APPLIED),
    (_P.GUARDED, _E.ABORT, _M.SAME): Rule(_P.IDLE, _V.OK, _X.REVERT),
    (_P.GUARDED, _E.EXPIRE, _M.SAME): Rule(_P.IDLE, _V.OK, _X.REVERT),
    (_P.APPLYING, _E.GUARD, _M.SAME): Rule(_P.APPLYING, _V.REPEAT, _X.FREEZE),
    (_P.APPLYING, _E.APPLY, _M.SAME): Rule(_P.APPLYING, _V.REPEAT),
    (_P.APPLYING, _E.COMMIT, _M.SAME): Rule(_P.IDLE, _V.OK, _X.RETIRE),
    (_P.APPLYING, _E.ABORT, _M.SAME): Rule(_P.IDLE, _V.OK, _X.REVERT),
    (_P.APPLYING, _E.EXPIRE, _M.SAME): Rule(_P.IDLE, _V.OK, _X.REVERT),
    **{(p, _E.GUARD, _M.OTHER): Rule(p, _V.BUSY) for p in _OPEN},
    **{(p, e, _M.OTHER): Rule(p, _V.STALE) for p in _OPEN for e in (_E.APPLY, _E.COMMIT, _E.ABORT)},
}

FINISHED_KEPT = 64  # finished request ids remembered (stale detection, idempotent finalize)


@dataclass(frozen=True)
class Txn:
    phase: Phase = Phase.IDLE
    request_id: str = ""
    instance_id: int = 0
    dead_ranks: frozenset[int] = frozenset()
    lease_deadline: float = 0.0
    # Ranks retired by committed transactions (cumulative).
    retired: frozenset[int] = frozenset()
    # request id -> "commit" | "abort" | "expire", oldest first.
    finished: tuple[tuple[str, str], ...] = ()

    def outcome_of(self, request_id: str) -> str | None:
        return dict(self.finished).get(request_id)


@dataclass(frozen=True)
class Step:
    txn: Txn
    verdict: Verdict
    effect: Effect
    # The ranks the effect concerns (dead ranks for PROXY_APPLY / RETIRE / REVERT).
    ranks: frozenset[int] = field(default_factory=frozenset)


def _finish(txn: Txn, how: str) -> tuple[tuple[str, str], ...]:
    return (*txn.finished, (txn.request_id, how))[-FINISHED_KEPT:]


def step(
    txn: Txn,
    event: Event,
    *,
    request_id: str = "",
    now: float = 0.0,
    lease_sec: float = 0.0,
    dead_ranks: Iterable[int] = (),
    instance_id: int = 0,
) -> Step:
    """Apply one call (or the lease check) to *txn*; the only place transitions happen."""
    if event is Event.EXPIRE:
        if txn.phase is Phase.IDLE or now < txn.lease_deadline:
            return Step(txn, Verdict.REPEAT, Effect.NONE)
        request_id = txn.request_id
    if (event in (Event.COMMIT, Event.ABORT) and txn.phase is Phase.IDLE
            and txn.outcome_of(request_id) == event.value):  # fmt: skip
        return Step(txn, Verdict.REPEAT, Effect.NONE, txn.retired)  # finalize repeated: idempotent
    if event is Event.GUARD and txn.outcome_of(request_id) is not None:
        return Step(txn, Verdict.STALE, Effect.NONE)  # a finished transaction is never reopened
    match = Match.SAME if txn.phase is not Phase.IDLE and request_id == txn.request_id else Match.OTHER
    rule = TRANSITIONS[(txn.phase, event, match)]
    if rule.verdict in (Verdict.STALE, Verdict.BUSY, Verdict.NOT_APPLIED):
        return Step(txn, rule.verdict, Effect.NONE)
    ranks = txn.dead_ranks
    if event is Event.GUARD:
        if rule.verdict is Verdict.OK:
            ranks = frozenset(dead_ranks)
            txn = replace(txn, request_id=request_id, instance_id=instance_id, dead_ranks=ranks)
        txn = replace(txn, phase=rule.next, lease_deadline=now + lease_sec)
    elif rule.next is Phase.IDLE:
        how = "expire" if event is Event.EXPIRE else event.value
        retired = txn.retired | txn.dead_ranks if rule.effect is Effect.RETIRE else txn.retired
        txn = Txn(Phase.IDLE, retired=retired, finished=_finish(txn, how))
        if rule.effect is Effect.RETIRE:
            ranks = retired
    else:
        txn = replace(txn, phase=rule.next)
    return Step(txn, rule.verdict, rule.effect, ranks)


class EngineHealth(enum.Enum):
    HEALTHY = "healthy"  # every surviving engine says healthy
    UNHEALTHY = "unhealthy"  # every surviving engine says unhealthy (or dead)
    MIXED = "mixed"
    UNKNOWN = "unknown"  # some engine did not answer
    NONE_LEFT = "none_left"  # no surviving engine on this node: nothing of ours blocks either step


def engine_health(statuses: Mapping[int, str | None]) -> EngineHealth:
    """Aggregate the surviving engines' own status (``None`` = no answer)."""
    values = list(statuses.values())
    if not values:
        return EngineHealth.NONE_LEFT
    if any(v is None for v in values):
        return EngineHealth.UNKNOWN
    norm = [str(v).lower() for v in values]
    if all(v == "healthy" for v in norm):
        return EngineHealth.HEALTHY
    if all(v in ("unhealthy", "dead") for v in norm):
        return EngineHealth.UNHEALTHY
    return EngineHealth.MIXED


class Reported(enum.Enum):
    """Mirror of the proto ``ScaleDownState`` (converted at the servicer)."""

    DISABLED = "disabled"
    IDLE = "idle"
    GUARDED = "guarded"
    APPLYING = "applying"
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


def reported_state(enabled: bool, txn: Txn, health: EngineHealth | None) -> Reported:
    """GUARDED until the survivors are all UNHEALTHY (they noticed the dead rank); after apply,
    APPLYING until they are all HEALTHY again; UNHEALTHY while applying means still reconfiguring."""
    if not enabled:
        return Reported.DISABLED
    if txn.phase is Phase.IDLE:
        return Reported.IDLE
    if txn.phase is Phase.GUARDED:
        ready = health in (EngineHealth.UNHEALTHY, EngineHealth.NONE_LEFT)
        return Reported.UNHEALTHY if ready else Reported.GUARDED
    if health in (EngineHealth.HEALTHY, EngineHealth.NONE_LEFT):
        return Reported.HEALTHY
    if health is EngineHealth.UNHEALTHY:
        return Reported.UNHEALTHY
    return Reported.APPLYING
