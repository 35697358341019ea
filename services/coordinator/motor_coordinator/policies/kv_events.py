"""kv_events: prefill goes where the prompt's prefix actually is, per the engines' KV events.

For a prompt given as token ids, the policy hashes its full blocks the engine's way
(:func:`motor_common.kv_events.block_hashes`: block size, hash seed) and asks the
:class:`~motor_coordinator.kv_index.KvIndex` how many leading blocks each candidate holds. Each
candidate costs ``load_score + prefix_weight x (1 - held / blocks)``: a full hit is worth
``prefix_weight`` queued requests (``scheduler.prefix_load_slack``), so a hot prefix spreads to a
second engine once the first is that much busier (and that engine then caches it too). Ties go to
the candidate order (stable).

Falls back to ``prefix_aware`` (the ring) when the request has no token ids, when it is shorter
than one block, when no candidate has a live, gap-free event stream (stale or unknown engines
count as holding nothing, so a partly stale set still uses what is known). A prefix no candidate
holds (not even its first block) is cold: it goes to the least loaded candidate (ties in turn) —
unlike the ring, the events follow it wherever it is cached, so cold placement is free to balance
load (with a handful of hot system prompts a ring often hashes two onto one engine). Decode uses
least load.

Hashing follows the candidates' engine type (vLLM or SGLang) unless :class:`BlockHashing` names
a flavour; block size, seed and int form come from ``scheduler.kv_events``.

Pure: no I/O; the index is fed elsewhere (:mod:`motor_coordinator.kv_subscriber`), token ids
come from :mod:`motor_coordinator.prompt_tokens`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from motor_common.domain import EngineType, Role
from motor_common.kv_events import DEFAULT_VLLM_SEED, Flavour, iter_block_hashes
from motor_coordinator.config import SchedulerConfig
from motor_coordinator.kv_index import KvIndex
from motor_coordinator.policies.base import Candidate, RequestInfo, load_score
from motor_coordinator.policies.least_load import LeastLoad
from motor_coordinator.policies.prefix_aware import PrefixAware


@dataclass(frozen=True)
class BlockHashing:
    """How the model's engines hash blocks (``--block-size`` / ``--page-size``, hash seed)."""

    flavour: Flavour | None = None  # None: the candidates' engine type
    block_size: int = 16
    seed: str = DEFAULT_VLLM_SEED
    int_hashes: bool = True  # vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (default 1)


class KvEvents:
    name = "kv_events"

    def __init__(self, cfg: SchedulerConfig, index: KvIndex, hashing: BlockHashing | None = None) -> None:
        self.index = index
        k = cfg.kv_events
        self.hashing = hashing or BlockHashing(None, k.block_size, k.hash_seed, k.int_hashes)
        self.prefix_weight = cfg.prefix_load_slack
        self.kv_usage_weight = cfg.kv_usage_weight
        self.ring = PrefixAware(cfg)
        self.least = LeastLoad(cfg)
        self.fallbacks = 0  # no ids, too short, or every candidate stale
        self.cold = 0  # nobody holds the first block
        self.routed = 0  # chosen by held prefix and load

    def select(self, role: Role, candidates: Sequence[Candidate], req: RequestInfo) -> Candidate:
        token_ids = req.token_ids
        if role is Role.DECODE:
            return self.least.select(role, candidates, req)
        h = self.hashing
        if not token_ids or len(token_ids) < h.block_size:
            return self._fallback(role, candidates, req)
        keys = [c.key for c in candidates]
        if all(self.index.is_stale(k) for k in keys):
            return self._fallback(role, candidates, req)
        flavour = h.flavour
        if flavour is None:
            sglang = candidates[0].instance.engine_type is EngineType.SGLANG
            flavour = Flavour.SGLANG if sglang else Flavour.VLLM
        # hashed lazily: the index walk stops at the first block no live candidate holds
        hashes = iter_block_hashes(flavour, token_ids, h.block_size, h.seed, int_hashes=h.int_hashes)
        held = self.index.prefix_lengths(req.model, hashes, keys)
        if not any(held.values()):
            self.cold += 1
            return self.least.select(role, candidates, req)
        self.routed += 1
        total = len(token_ids) // h.block_size
        best = candidates[0]
        best_cost = float("inf")
        for c in candidates:
            cost = load_score(c, self.kv_usage_weight) + self.prefix_weight * (1 - held[c.key] / total)
            if cost < best_cost:
                best, best_cost = c, cost
        return best

    def _fallback(self, role: Role, candidates: Sequence[Candidate], req: RequestInfo) -> Candidate:
        self.fallbacks += 1
        return self.ring.select(role, candidates, req)
