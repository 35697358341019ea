"""least_load: lowest in-flight/engine queue + weighted KV usage; ties broken round-robin."""

from __future__ import annotations

from collections.abc import Sequence

from motor_common.domain import Role
from motor_coordinator.config import SchedulerConfig
from motor_coordinator.policies.base import Candidate, LiveSet, RequestInfo, load_score


class LeastLoad:
    name = "least_load"

    def __init__(self, cfg: SchedulerConfig) -> None:
        self.kv_usage_weight = cfg.kv_usage_weight

    def select(self, role: Role, candidates: Sequence[Candidate], req: RequestInfo) -> Candidate:
        scores = [load_score(c, self.kv_usage_weight) for c in candidates]
        best = min(scores)
        tied = [c for c, s in zip(candidates, scores, strict=True) if s == best]
        return tied[req.seq % len(tied)]

    def select_index(self, role: Role, live: LiveSet, req: RequestInfo) -> int | None:
        tied = live.tied()
        return tied[req.seq % len(tied)]
