"""KV-cache block manager with a prefix cache (pure, no I/O).

Blocks hold ``block_size`` tokens. Every *full* prompt block is registered under a chained hash of
its tokens (vLLM style), so a later prompt sharing that prefix reuses the block instead of
recomputing it. Freed blocks keep their hash and are evicted least-recently-freed first.

A sequence reserves, at admission, every block it can ever need (prompt plus ``max_tokens`` per
choice); there is therefore no preemption, and ``usage`` counts reserved blocks.

With ``kv_events`` on (the engine's ``--kv-events-config``), blocks are hashed the engine's way
(``hasher``: vLLM's or SGLang's chained SHA-256, :mod:`motor_common.kv_events`) and every change of
the prefix cache is queued in ``pending_events`` as the engine reports it: one ``BlockStored`` per
allocation for its newly cached full prompt blocks (parent = the block before them), one
``BlockRemoved`` per cached block evicted to make room, ``AllBlocksCleared`` on :meth:`reset`.
``on_events`` (no I/O) is called when events were queued so a publisher can wake up.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from motor_common.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent


class NoFreeBlocks(Exception):
    """Not enough free blocks for the requested allocation."""


@dataclass(frozen=True, slots=True)
class Allocation:
    block_ids: tuple[int, ...]
    cached_tokens: int


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def block_hashes(prompt_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of ``prompt_ids``."""
    out: list[int] = []
    parent = 0
    for start in range(0, len(prompt_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(prompt_ids[start : start + block_size])))
        out.append(parent)
    return out


@dataclass
class BlockManager:
    num_blocks: int
    block_size: int = 16
    enable_prefix_caching: bool = True
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0  # prompt tokens found in the prefix cache
    _ref: list[int] = field(init=False)
    _free: OrderedDict[int, None] = field(init=False)
    _block_hash: dict[int, int] = field(init=False, default_factory=dict)
    _by_hash: dict[int, int] = field(init=False, default_factory=dict)
    _seqs: dict[str, tuple[int, ...]] = field(init=False, default_factory=dict)
    # KV events (off unless a hasher is given)
    hasher: Callable[[Sequence[int], int], list[Any]] | None = None
    on_events: Callable[[], None] | None = None
    pending_events: list[KVEvent] = field(init=False, default_factory=list)
    evicted_blocks: int = field(init=False, default=0)  # cached blocks dropped to make room

    def __post_init__(self) -> None:
        if self.num_blocks <= 0 or self.block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self._ref = [0] * self.num_blocks
        self._free = OrderedDict((i, None) for i in range(self.num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        return self.num_used / self.num_blocks

    def _hashes(self, prompt_ids: Sequence[int]) -> list[Any]:
        if self.hasher is not None:
            return self.hasher(prompt_ids, self.block_size)
        return block_hashes(prompt_ids, self.block_size)

    def take_events(self) -> list[KVEvent]:
        out, self.pending_events = self.pending_events, []
        return out

    def reset(self) -> bool:
        """Drop every cached block not in use (vLLM's reset_prefix_cache); False if some are."""
        if any(r > 0 for r in self._ref):
            return False
        self._by_hash.clear()
        self._block_hash.clear()
        if self.hasher is not None:
            self.pending_events.append(AllBlocksCleared())
            if self.on_events is not None:
                self.on_events()
        return True

    def holds(self, seq_id: str) -> bool:
        return seq_id in self._seqs

    def block_ids(self, seq_id: str) -> tuple[int, ...]:
        return self._seqs[seq_id]

    def _cached_prefix(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        hit: list[int] = []
        if not self.enable_prefix_caching:
            return hit
        for h in hashes[:max_blocks]:
            b = self._by_hash.get(h)
            if b is None:
                break
            hit.append(b)
        return hit

    def can_allocate(self, prompt_ids: Sequence[int], total_tokens: int) -> bool:
        hashes = self._hashes(prompt_ids)
        hit = self._cached_prefix(hashes, (len(prompt_ids) - 1) // self.block_size)
        reusable_free = sum(1 for b in hit if self._ref[b] == 0)
        need = blocks_for(total_tokens, self.block_size) - len(hit)
        return need <= len(self._free) - reusable_free

    def allocate(self, seq_id: str, prompt_ids: Sequence[int], total_tokens: int) -> Allocation:
        """Reserve blocks for ``total_tokens`` tokens, reusing cached prompt-prefix blocks.

        The last prompt token is always recomputed (as vLLM does), so at most
        ``(len(prompt) - 1) // block_size`` blocks can hit.
        """
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} already holds blocks")
        total_tokens = max(total_tokens, len(prompt_ids), 1)
        hashes = self._hashes(prompt_ids)
        hit = self._cached_prefix(hashes, (len(prompt_ids) - 1) // self.block_size)
        reusable_free = sum(1 for b in hit if self._ref[b] == 0)
        need = blocks_for(total_tokens, self.block_size) - len(hit)
        if need > len(self._free) - reusable_free:
            raise NoFreeBlocks(f"need {need} blocks, {len(self._free) - reusable_free} free")
        for b in hit:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1
        new: list[int] = []
        events = self.hasher is not None
        evicted: list[Any] = []
        for _ in range(need):
            b, _none = self._free.popitem(last=False)
            old = self._block_hash.pop(b, None)
            if old is not None and self._by_hash.get(old) == b:
                del self._by_hash[old]
                self.evicted_blocks += 1
                if events:
                    evicted.append(old)
            self._ref[b] = 1
            new.append(b)
        blocks = tuple(hit + new)
        stored: list[Any] = []
        first_stored = -1
        if self.enable_prefix_caching:
            for i in range(len(hit), len(hashes)):
                h = hashes[i]
                if h not in self._by_hash:
                    self._by_hash[h] = blocks[i]
                    self._block_hash[blocks[i]] = h
                    if events and (not stored or i == first_stored + len(stored)):
                        if not stored:
                            first_stored = i
                        stored.append(h)
        if evicted:
            self.pending_events.extend(BlockRemoved((h,)) for h in evicted)
        if stored:
            bs = self.block_size
            parent = hashes[first_stored - 1] if first_stored > 0 else None
            toks = tuple(prompt_ids[first_stored * bs : (first_stored + len(stored)) * bs])
            self.pending_events.append(BlockStored(tuple(stored), parent, toks, bs))
        if (evicted or stored) and self.on_events is not None:
            self.on_events()
        self._seqs[seq_id] = blocks
        cached = len(hit) * self.block_size
        self.prefix_queries += len(prompt_ids)
        self.prefix_hits += cached
        return Allocation(blocks, cached)

    def free(self, seq_id: str) -> bool:
        """Release a sequence's blocks (cached ones stay reusable); False if unknown."""
        blocks = self._seqs.pop(seq_id, None)
        if blocks is None:
            return False
        for b in reversed(blocks):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None
        return True
