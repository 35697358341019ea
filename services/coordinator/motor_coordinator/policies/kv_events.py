"""kv_events: prefill goes where the prompt's prefix actually is, per the engines' KV events.

For a prompt given as token ids, the policy hashes its full blocks the engine's way
(:func:`motor_common.kv_events.block_hashes`: block size, hash seed) and asks the
:class:`~motor_coordinator.kv_index.KvIndex` how many leading blocks each candidate holds. Then it
predicts, in prompt tokens, when each candidate would have this prefill done — a prefill engine
computes one batch at a time, so its queue is work too::

    cost = tokens queued there (this coordinator's prefills in flight, as estimated when chosen)
         + 2 x tokens of this prompt it would compute (the prompt minus the prefix it holds)

and takes the cheapest (a computed token is weighed twice: it delays this request and, as work
left there, the requests queued behind it — :data:`COMPUTE_WEIGHT`); ties go to the lower
:func:`load_score` (in-flight count or the engine's own gauges), then in turn. A hot prefix
therefore stays on its holder until the holder's queue costs more than twice computing the prefix
elsewhere, and then spreads (that engine then caches it too). The chosen tokens are returned in a
:class:`PrefillChoice`, and the scheduler queues them on the endpoint while the prefill runs
(``Candidate.queued_tokens``). The engine's scraped gauges are a scrape interval old, so they only
break ties; the ledger is current.

Falls back to ``prefix_aware`` (the ring) when the request has no token ids, when it is shorter
than one block, when no candidate has a live, gap-free event stream (stale or unknown engines
count as holding nothing, so a partly stale set still uses what is known). A prefix no candidate
holds (not even its first block) is cold: every candidate would compute all of it, so the
shortest queue wins (ties in turn) — unlike the ring, the events follow the prefix wherever it is
cached, so cold placement is free to balance load (with a handful of hot system prompts a ring
often hashes two onto one engine). Decode uses least load.

Hashing follows the candidates' engine type (vLLM or SGLang) unless :class:`BlockHashing` names
a flavour; the block size is the one the model's engines report in their ``BlockStored`` events
(``scheduler.kv_events.block_size`` until one arrived); seed and int form come from
``scheduler.kv_events``. Sending a prefill that stores a new block tells the index to expect
events from that engine (a silent publisher then turns stale: :class:`KvIndex`) and marks the
blocks it will compute pending there: until its ``BlockStored`` arrive (or a short TTL passes)
they count as held, so a second request with the same new prefix (a new chat with the same system
prompt) sent before the events follows the first instead of computing the prefix again elsewhere.

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
from motor_coordinator.policies.base import Candidate, PrefillChoice, RequestInfo, load_score
from motor_coordinator.policies.least_load import LeastLoad
from motor_coordinator.policies.prefix_aware import PrefixAware


@dataclass(frozen=True)
class BlockHashing:
    """How the model's engines hash blocks (``--block-size`` / ``--page-size``, hash seed)."""

    flavour: Flavour | None = None  # None: the candidates' engine type
    block_size: int = 16
    seed: str = DEFAULT_VLLM_SEED
    int_hashes: bool = True  # vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (default 1)


# A computed token counts twice: once for this request's wait and once as work left on that engine
# for the requests behind it (and a duplicate copy of the prefix taking cache room there). With 1,
# the greedy "finishes first" choice moved a chat off its holder as soon as the holder's queue
# passed the chat's prefix, recomputing system prompts and histories on every engine: more
# evictions and a lower hit rate under load (bench/scheduling.py, docs/benchmarks.md).
COMPUTE_WEIGHT = 2


class KvEvents:
    name = "kv_events"

    def __init__(self, cfg: SchedulerConfig, index: KvIndex, hashing: BlockHashing | None = None) -> None:
        self.index = index
        k = cfg.kv_events
        self.hashing = hashing or BlockHashing(None, k.block_size, k.hash_seed, k.int_hashes)
        self.kv_usage_weight = cfg.kv_usage_weight
        self.ring = PrefixAware(cfg)
        self.least = LeastLoad(cfg)
        self.fallbacks = 0  # no ids, too short, or every candidate stale
        self.cold = 0  # nobody holds the first block: the shortest queue
        self.routed = 0  # chosen by held prefix and queue

    def select(self, role: Role, candidates: Sequence[Candidate], req: RequestInfo) -> Candidate:
        if role is Role.DECODE:
            return self.least.select(role, candidates, req)
        return self.select_prefill(candidates, req).candidate

    def select_prefill(self, candidates: Sequence[Candidate], req: RequestInfo) -> PrefillChoice:
        token_ids = req.token_ids
        h = self.hashing
        n = len(token_ids) if token_ids else 0
        # the block size the model's engines report, else the configured one
        block = self.index.block_size(req.model) or h.block_size
        if not token_ids or n < block:
            return PrefillChoice(self._fallback(candidates, req), n)
        keys = [c.key for c in candidates]
        if all(self.index.is_stale(k) for k in keys):
            return PrefillChoice(self._fallback(candidates, req), n)
        flavour = h.flavour
        if flavour is None:
            sglang = candidates[0].instance.engine_type is EngineType.SGLANG
            flavour = Flavour.SGLANG if sglang else Flavour.VLLM
        # all blocks: the chosen engine gets the ones it lacks as pending (the index counts them
        # held there until it reports them stored, so a same-prefix request sent meanwhile follows)
        hashes = list(iter_block_hashes(flavour, token_ids, block, h.seed, int_hashes=h.int_hashes))
        held = self.index.prefix_lengths(req.model, hashes, keys)
        if any(held.values()):
            self.routed += 1
        else:
            self.cold += 1
        choice = self._cheapest(candidates, req, {k: n - blocks * block for k, blocks in held.items()})
        if choice.tokens >= block:  # it stores a new block: its publisher should speak
            key = choice.candidate.key
            self.index.expect_events(key)
            self.index.add_pending(key, hashes[held[key]:])
        return choice

    def _cheapest(self, candidates: Sequence[Candidate], req: RequestInfo, uncached: dict[str, int]) -> PrefillChoice:
        """The cheapest candidate: fewest queued + COMPUTE_WEIGHT x uncached tokens, then the lowest
        load score, then in turn."""
        best: tuple[int, float] | None = None
        tied: list[Candidate] = []
        for c in candidates:
            rank = (c.queued_tokens + COMPUTE_WEIGHT * uncached[c.key], load_score(c, self.kv_usage_weight))
            if best is None or rank < best:
                best, tied = rank, [c]
            elif rank == best:
                tied.append(c)
        chosen = tied[req.seq % len(tied)]
        return PrefillChoice(chosen, uncached[chosen.key])

    def _fallback(self, candidates: Sequence[Candidate], req: RequestInfo) -> Candidate:
        self.fallbacks += 1
        return self.ring.select(Role.PREFILL, candidates, req)
