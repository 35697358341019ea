"""The endpoint lifecycle: the only place endpoint status transitions happen. Pure, no I/O.

Observations come from the health poller (HEALTHY / UNHEALTHY, each carrying the generation it was
taken under) and from the process watcher (EXITED). Operators pause and resume.

    current \\ observation   HEALTHY   UNHEALTHY               EXITED
    INITIAL                  NORMAL    INITIAL in grace,        ABNORMAL
                                       else ABNORMAL
    NORMAL                   NORMAL    NORMAL in grace,         ABNORMAL
                                       else ABNORMAL
    ABNORMAL                 NORMAL    ABNORMAL                 ABNORMAL
    PAUSED                   PAUSED    PAUSED                   PAUSED   (sticky: only resume leaves)
    RETIRED                  RETIRED   RETIRED                  RETIRED  (scale-down; never polled)

A probe taken under a generation older than the endpoint's is ignored. Anything the poller cannot
classify as healthy (503, timeout, refused, garbage) is UNHEALTHY.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from motor_common.domain import EndpointStatus


class Observation(enum.Enum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    EXITED = "exited"


class _Rule(enum.Enum):
    TO_NORMAL = "normal"
    TO_ABNORMAL = "abnormal"
    KEEP = "keep"
    KEEP_IN_GRACE = "keep-in-grace"  # keep the current status during start-up grace, else ABNORMAL


_S, _O = EndpointStatus, Observation
TRANSITIONS: dict[tuple[EndpointStatus, Observation], _Rule] = {
    (_S.INITIAL, _O.HEALTHY): _Rule.TO_NORMAL,
    (_S.INITIAL, _O.UNHEALTHY): _Rule.KEEP_IN_GRACE,
    (_S.INITIAL, _O.EXITED): _Rule.TO_ABNORMAL,
    (_S.NORMAL, _O.HEALTHY): _Rule.TO_NORMAL,
    (_S.NORMAL, _O.UNHEALTHY): _Rule.KEEP_IN_GRACE,
    (_S.NORMAL, _O.EXITED): _Rule.TO_ABNORMAL,
    (_S.ABNORMAL, _O.HEALTHY): _Rule.TO_NORMAL,
    (_S.ABNORMAL, _O.UNHEALTHY): _Rule.TO_ABNORMAL,
    (_S.ABNORMAL, _O.EXITED): _Rule.TO_ABNORMAL,
    (_S.PAUSED, _O.HEALTHY): _Rule.KEEP,
    (_S.PAUSED, _O.UNHEALTHY): _Rule.KEEP,
    (_S.PAUSED, _O.EXITED): _Rule.KEEP,
    (_S.RETIRED, _O.HEALTHY): _Rule.KEEP,
    (_S.RETIRED, _O.UNHEALTHY): _Rule.KEEP,
    (_S.RETIRED, _O.EXITED): _Rule.KEEP,
}


@dataclass(frozen=True)
class EndpointState:
    endpoint_id: int
    status: EndpointStatus = EndpointStatus.INITIAL
    generation: int = 0
    launched_at: float = 0.0
    pid: int = 0
    # Ever NORMAL since the last launch: only such an endpoint can be reported dead.
    was_normal: bool = False
    detail: str = ""
    # Status before PAUSED, restored by resume.
    before_pause: EndpointStatus | None = None

    def in_grace(self, now: float, grace_sec: float) -> bool:
        return now - self.launched_at < grace_sec


def launched(endpoint_id: int, *, generation: int, now: float, pid: int) -> EndpointState:
    """A freshly (re)launched engine: INITIAL, never NORMAL."""
    return EndpointState(endpoint_id, EndpointStatus.INITIAL, generation, now, pid)


def observe(
    state: EndpointState,
    obs: Observation,
    *,
    generation: int,
    now: float,
    grace_sec: float,
    detail: str = "",
) -> EndpointState:
    """Apply one observation; returns *state* unchanged when it is stale or the status is sticky."""
    if generation < state.generation:
        return state
    rule = TRANSITIONS[(state.status, obs)]
    if rule is _Rule.KEEP:
        return state
    if rule is _Rule.KEEP_IN_GRACE and state.in_grace(now, grace_sec):
        return dataclasses.replace(state, generation=generation, detail=detail)
    if rule is _Rule.TO_NORMAL:
        return dataclasses.replace(state, status=EndpointStatus.NORMAL, generation=generation, was_normal=True, detail="")
    return dataclasses.replace(state, status=EndpointStatus.ABNORMAL, generation=generation, detail=detail)


def failure_streak(streak: int, obs: Observation, threshold: int) -> tuple[int, bool]:
    """Debounce of ``/health`` probes (``health.failure_threshold``): the new count of failed probes
    in a row after *obs*, and whether *obs* is passed on to :func:`observe`. A healthy probe resets
    the count and is passed on at once; a failed one only once it is the *threshold*-th in a row, so
    one slow answer (an engine busy for a moment, or this process starved past the probe's
    timeout) never makes an endpoint ABNORMAL, which for a once-NORMAL engine means a relaunch."""
    if obs is Observation.HEALTHY:
        return 0, True
    streak += 1
    return streak, streak >= threshold


def pause(state: EndpointState) -> EndpointState:
    if state.status in (EndpointStatus.PAUSED, EndpointStatus.RETIRED):
        return state
    return dataclasses.replace(state, status=EndpointStatus.PAUSED, before_pause=state.status)


def resume(state: EndpointState) -> EndpointState:
    if state.status is not EndpointStatus.PAUSED:
        return state
    return dataclasses.replace(state, status=state.before_pause or EndpointStatus.INITIAL, before_pause=None)


def with_generation(state: EndpointState, generation: int) -> EndpointState:
    """Newer controller data arrived: older probes no longer apply."""
    return dataclasses.replace(state, generation=max(state.generation, generation))
