"""Latency cost model (pure, no I/O).

prefill time = base + per-token x *uncached* prompt tokens; with ``prefill_slots`` N > 0 at most
N prefills compute at once (FIFO), as an engine's one accelerator does (0: unbounded, each
prefill only costs its own time);
decode interval = per-token base + per-sequence x running batch size;
KV transfer = per-block x blocks moved. Everything scales with ``slow_factor``; in zero-latency
mode every duration is 0 (callers then only yield to the event loop).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class CostModel:
    prefill_base_ms: float = 2.0
    prefill_ms_per_token: float = 0.05
    decode_ms_per_token: float = 5.0
    decode_ms_per_seq: float = 0.1
    kv_transfer_ms_per_block: float = 0.02
    zero_latency: bool = False
    slow_factor: float = 1.0
    prefill_slots: int = 0  # prefills computing at once (0: unbounded)

    def prefill_s(self, uncached_tokens: int) -> float:
        if self.zero_latency:
            return 0.0
        ms = self.prefill_base_ms + self.prefill_ms_per_token * max(0, uncached_tokens)
        return ms * self.slow_factor / 1000.0

    def decode_interval_s(self, batch_size: int) -> float:
        if self.zero_latency:
            return 0.0
        ms = self.decode_ms_per_token + self.decode_ms_per_seq * max(1, batch_size)
        return ms * self.slow_factor / 1000.0

    def transfer_s(self, blocks: int) -> float:
        if self.zero_latency:
            return 0.0
        return self.kv_transfer_ms_per_block * max(0, blocks) * self.slow_factor / 1000.0

    def slowed(self, factor: float) -> CostModel:
        return replace(self, slow_factor=factor)
