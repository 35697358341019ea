"""Admission and pacing: the simulated engine core.

``Engine`` bounds the running batch by ``max_num_seqs`` and the KV block budget; requests that do
not fit wait in FIFO order (the ``num_requests_waiting`` gauge). It owns no tasks: every coroutine
runs in the caller's request task, so a cancelled request (client disconnect) releases everything
in its ``finally``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from motor_sim.costmodel import CostModel
from motor_sim.kvcache import Allocation, BlockManager


@dataclass
class _Waiter:
    fut: asyncio.Future[Allocation]
    seq_id: str
    prompt_ids: Sequence[int]
    total_tokens: int


@dataclass
class Stats:
    """Monotonic counters read by ``metrics``."""

    requests_finished: int = 0
    finished_length: int = 0
    finished_stop: int = 0
    requests_aborted: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    kv_transfers: int = 0
    kv_transfer_fallbacks: int = 0
    kv_load_failures: int = 0
    # vLLM's vllm:prompt_tokens_by_source: computed here, prefix-cache hits, loaded from a prefill
    prompt_tokens_local_compute: int = 0
    prompt_tokens_local_cache_hit: int = 0
    prompt_tokens_external_kv_transfer: int = 0
    kv_lease_expirations: int = 0


class Engine:
    def __init__(self, blocks: BlockManager, cost: CostModel, max_num_seqs: int) -> None:
        self.blocks = blocks
        self.cost = cost
        self.max_num_seqs = max_num_seqs
        self.running: set[str] = set()
        self._waiting: deque[_Waiter] = deque()
        self.stats = Stats()
        self.extra_token_delay_s = 0.0  # "slow" fault in zero-latency mode
        # the accelerator: at most cost.prefill_slots prefills compute at once, the rest queue (FIFO)
        self._compute = asyncio.Semaphore(cost.prefill_slots) if cost.prefill_slots > 0 else None
        self.prefills_computing = 0

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return sum(1 for w in self._waiting if not w.fut.done())

    def _fits(self, prompt_ids: Sequence[int], total_tokens: int) -> bool:
        return len(self.running) < self.max_num_seqs and self.blocks.can_allocate(
            prompt_ids, total_tokens
        )

    async def admit(self, seq_id: str, prompt_ids: Sequence[int], total_tokens: int) -> Allocation:
        """Wait for a batch slot and KV blocks; returns the allocation (cached prefix tokens)."""
        if not self._waiting and self._fits(prompt_ids, total_tokens):
            alloc = self.blocks.allocate(seq_id, prompt_ids, total_tokens)
            self.running.add(seq_id)
            return alloc
        fut: asyncio.Future[Allocation] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(fut, seq_id, prompt_ids, total_tokens)
        self._waiting.append(waiter)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.finish(seq_id)  # admitted just as we were cancelled
            raise
        finally:
            if waiter in self._waiting:
                self._waiting.remove(waiter)

    def finish(self, seq_id: str, keep_blocks: bool = False) -> None:
        """Leave the running batch; free the blocks unless they are pinned for a transfer."""
        self.running.discard(seq_id)
        if not keep_blocks:
            self.blocks.free(seq_id)
        self._drain()

    def free_blocks(self, seq_id: str) -> bool:
        freed = self.blocks.free(seq_id)
        if freed:
            self._drain()
        return freed

    def _drain(self) -> None:
        while self._waiting:
            w = self._waiting[0]
            if w.fut.done():
                self._waiting.popleft()
                continue
            if not self._fits(w.prompt_ids, w.total_tokens):
                break
            self._waiting.popleft()
            alloc = self.blocks.allocate(w.seq_id, w.prompt_ids, w.total_tokens)
            self.running.add(w.seq_id)
            w.fut.set_result(alloc)

    async def prefill(self, uncached_tokens: int) -> None:
        delay = self.cost.prefill_s(uncached_tokens)
        if self._compute is None:
            await self._compute_for(delay)
            return
        async with self._compute:
            await self._compute_for(delay)

    async def _compute_for(self, delay: float) -> None:
        self.prefills_computing += 1
        try:
            await asyncio.sleep(delay)
        finally:
            self.prefills_computing -= 1

    async def transfer(self, blocks: int) -> None:
        await asyncio.sleep(self.cost.transfer_s(blocks))

    def decode_delay_s(self) -> float:
        return self.cost.decode_interval_s(len(self.running)) + self.extra_token_delay_s
