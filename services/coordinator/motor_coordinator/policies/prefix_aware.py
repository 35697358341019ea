"""prefix_aware: requests sharing a prompt prefix go to the same prefill endpoint.

The first ``prefix_chars`` characters of the rendered prompt are hashed with each candidate's key
(rendezvous hashing): the choice is consistent while the healthy set is stable, and only the keys of
a removed endpoint move. Load guard: when the preferred endpoint's load exceeds the least loaded
one's by more than ``prefix_load_slack``, the least loaded wins. Decode (and prompts without text)
use least_load.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from motor_common.domain import Role
from motor_coordinator.config import SchedulerConfig
from motor_coordinator.policies.base import Candidate, LiveSet, RequestInfo, load_score
from motor_coordinator.policies.least_load import LeastLoad


def _weight(prefix: str, key: str) -> int:
    digest = hashlib.blake2b(f"{prefix}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class PrefixAware:
    name = "prefix_aware"

    def __init__(self, cfg: SchedulerConfig) -> None:
        self.slack = cfg.prefix_load_slack
        self.kv_usage_weight = cfg.kv_usage_weight
        self.fallback = LeastLoad(cfg)

    def preferred(self, candidates: Sequence[Candidate], prefix: str) -> Candidate:
        return max(candidates, key=lambda c: _weight(prefix, c.key))

    def select(self, role: Role, candidates: Sequence[Candidate], req: RequestInfo) -> Candidate:
        if role is Role.DECODE or not req.prefix:
            return self.fallback.select(role, candidates, req)
        choice = self.preferred(candidates, req.prefix)
        least = min(load_score(c, self.kv_usage_weight) for c in candidates)
        if load_score(choice, self.kv_usage_weight) > least + self.slack:
            return self.fallback.select(role, candidates, req)
        return choice

    def select_index(self, role: Role, live: LiveSet, req: RequestInfo) -> int | None:
        """Decode and prompts without text: least_load's index. Prefill with a prefix: None
        (rendezvous hashing looks at every candidate)."""
        if role is Role.DECODE or not req.prefix:
            return self.fallback.select_index(role, live, req)
        return None
