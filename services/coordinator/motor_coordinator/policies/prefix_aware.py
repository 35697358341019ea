"""prefix_aware: requests sharing a prompt prefix go to the same prefill endpoint.

The first ``prefix_chars`` characters of the rendered prompt are placed on a consistent-hash ring
of the candidates' keys (:mod:`.prefix_ring`, ``VNODES`` points per key): the choice is a bisect,
O(log n); it is consistent while the healthy set is stable, and when an endpoint leaves only the
prefixes it owned move. The ring is built once per scheduler live set (``LiveSet.memo``: rebuilt
only when the schedulable endpoints change) and, on the slow path (``select`` over built
candidates: retries that exclude an endpoint, mixed engine types, precision re-routes), taken from
a small cache of rings; a set that lost a few members is served by its superset's ring. Both
paths choose the same endpoint for the same set.

Load guard: when the preferred endpoint's load exceeds the least loaded one's by more than
``prefix_load_slack``, least_load's choice wins (the live set's load index gives the least loaded
score without a scan). Decode (and prompts without text) use least_load.
"""

from __future__ import annotations

from collections.abc import Sequence

from motor_common.domain import Role
from motor_coordinator.config import SchedulerConfig
from motor_coordinator.policies.base import Candidate, LiveSet, RequestInfo, load_score
from motor_coordinator.policies.least_load import LeastLoad
from motor_coordinator.policies.prefix_ring import RingCache, RingView, prefix_point


class PrefixAware:
    name = "prefix_aware"

    def __init__(self, cfg: SchedulerConfig) -> None:
        self.slack = cfg.prefix_load_slack
        self.kv_usage_weight = cfg.kv_usage_weight
        self.fallback = LeastLoad(cfg)
        self._rings = RingCache()

    def _live_view(self, live: LiveSet) -> RingView:
        return self._rings.view((live.model, live.role), [live.key_at(i) for i in range(live.size)])

    def select(self, role: Role, candidates: Sequence[Candidate], req: RequestInfo) -> Candidate:
        if role is Role.DECODE or not req.prefix:
            return self.fallback.select(role, candidates, req)
        view = self._rings.view((req.model, role), [c.key for c in candidates])
        choice = candidates[view.choose(prefix_point(req.prefix))]
        least = min(load_score(c, self.kv_usage_weight) for c in candidates)
        if load_score(choice, self.kv_usage_weight) > least + self.slack:
            return self.fallback.select(role, candidates, req)
        return choice

    def select_index(self, role: Role, live: LiveSet, req: RequestInfo) -> int | None:
        if role is Role.DECODE or not req.prefix:
            return self.fallback.select_index(role, live, req)
        choice = live.memo(self._live_view).choose(prefix_point(req.prefix))
        tied = live.tied()
        if live.score_at(choice) > live.score_at(tied[0]) + self.slack:
            return self.fallback.select_index(role, live, req)
        return choice
