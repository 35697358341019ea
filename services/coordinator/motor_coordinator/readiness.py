"""Readiness of a coordinator (pure): ask leadership, then whether anything is schedulable."""

from __future__ import annotations

from dataclasses import dataclass

NO_ROUTE = "no schedulable prefill+decode pair or union instance"
NOT_MASTER = "Coordinator is not master"
ISOLATED = "isolated"


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str = ""


def evaluate(*, is_master: bool, isolated: bool, schedulable: bool) -> Readiness:
    if isolated:
        return Readiness(False, ISOLATED)
    if not is_master:
        return Readiness(False, NOT_MASTER)
    if not schedulable:
        return Readiness(False, NO_ROUTE)
    return Readiness(True)
