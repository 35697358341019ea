"""round_robin: the request sequence number modulo the candidates (stateless)."""

from __future__ import annotations

from collections.abc import Sequence

from motor_common.domain import Role
from motor_coordinator.config import SchedulerConfig
from motor_coordinator.policies.base import Candidate, LiveSet, RequestInfo


class RoundRobin:
    name = "round_robin"

    def __init__(self, cfg: SchedulerConfig) -> None:
        del cfg

    def select(self, role: Role, candidates: Sequence[Candidate], req: RequestInfo) -> Candidate:
        return candidates[req.seq % len(candidates)]

    def select_index(self, role: Role, live: LiveSet, req: RequestInfo) -> int | None:
        return req.seq % live.size
