"""Which engine holds which KV blocks, fed by the engines' own KV events (pure, no I/O).

One :class:`KvIndex` per coordinator; engines are grouped by model (block hashes do not name the
model, so two models' indexes never mix). Every engine's event stream carries sequence numbers:

- ``seq == last + 1`` (or the first batch seen): applied.
- ``seq == 0`` live after any batch: the engine restarted (its publisher counts from 0 again):
  the engine's blocks are dropped, then the batch is applied — unless the last batch came from a
  replay and this one is not newer: then it is the live copy of a replayed batch (a duplicate).
- ``seq <= last`` otherwise: a duplicate (replayed twice, or live batches that a replay already
  delivered), ignored. A restart whose batch 0 was lost looks like duplicates until the stream
  passes ``last``; the subscriber therefore also resets an engine that re-registers
  (:meth:`KvIndex.remove_engine` / :meth:`KvIndex.add_engine`).
- ``seq > last + 1``: a gap. Nothing is applied; the engine is marked stale and the caller is
  told to replay from ``last + 1`` (:class:`Gap`). If the replay cannot fill it,
  :meth:`KvIndex.resync` drops the engine's blocks and restarts from the given sequence number.

A connected publisher can still go silent (its thread died, the engine stopped publishing).
Silence alone proves nothing — an idle engine has nothing to say — so the index is told when an
engine should speak: :meth:`KvIndex.expect_events` when a prefill that stores at least one new
block was sent to it. If no batch at all arrives within ``silence_timeout`` after that, the engine
counts as stale (holding nothing) until its next batch.

``AllBlocksCleared`` drops the engine's blocks. Memory is bounded: at most ``max_blocks_per_engine``
hashes per engine, the least recently stored dropped first (an under-estimate of what the engine
holds, never an invention). A stale engine counts as holding nothing.

Blocks sent but not yet stored: when a prefill is sent to an engine, the policy marks the
prompt's blocks *pending* there (:meth:`KvIndex.add_pending`). Until the engine's ``BlockStored``
for them arrives they count as held (:meth:`KvIndex.prefix_lengths`), so a second request with the
same new prefix arriving before the events (a new chat with the same system prompt) goes to the
engine that is computing it instead of computing it again elsewhere. A pending block expires after
``pending_ttl`` seconds (the prefill failed, or its blocks were evicted at once), turns into a held
block when stored, and is dropped with the engine's blocks (restart, ``AllBlocksCleared``,
resync, removal) and when its stream goes stale. At most ``max_pending_per_engine`` per engine,
the oldest dropped first.

The block size of a model's engines is learned from their ``BlockStored`` events
(:meth:`KvIndex.block_size`), so two models may use different ones.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from motor_common.kv_events import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    EventBatch,
)


@dataclass(frozen=True, slots=True)
class Applied:
    pass


@dataclass(frozen=True, slots=True)
class Duplicate:
    pass


@dataclass(frozen=True, slots=True)
class Gap:
    """Batches ``from_seq .. seq - 1`` are missing: replay from ``from_seq``."""

    from_seq: int


ApplyResult = Applied | Duplicate | Gap


@dataclass
class _Engine:
    model: str
    last_seq: int | None = None
    stale: bool = False
    blocks: OrderedDict[BlockHash, None] = field(default_factory=OrderedDict)
    restarts: int = 0
    # the last applied batch came from a replay: live copies of it may still be queued
    last_replayed: bool = False
    # when the engine was first expected to publish (expect_events) and has not yet
    awaiting_since: float | None = None
    # blocks sent to it in a prefill, not yet stored -> when they expire (oldest first)
    pending: OrderedDict[BlockHash, float] = field(default_factory=OrderedDict)


# How long a block sent in a prefill counts as held before its BlockStored arrives: a few queued
# prefills' time on a busy engine; a block the engine stores sooner is held from then on.
PENDING_TTL = 5.0
MAX_PENDING_PER_ENGINE = 20_000


class KvIndex:
    def __init__(self, max_blocks_per_engine: int = 200_000, *, silence_timeout: float = 0.0,
                 clock: Callable[[], float] = time.monotonic, pending_ttl: float = PENDING_TTL,
                 max_pending_per_engine: int = MAX_PENDING_PER_ENGINE) -> None:
        """*silence_timeout* (seconds, 0 = never): an engine expected to publish
        (:meth:`expect_events`) that stays silent this long counts as stale. *pending_ttl*
        (seconds, 0 = off): how long blocks sent to an engine (:meth:`add_pending`) count as held
        there before it reports them stored; at most *max_pending_per_engine* of them."""
        if max_blocks_per_engine <= 0:
            raise ValueError("max_blocks_per_engine must be positive")
        if silence_timeout < 0:
            raise ValueError("silence_timeout must be >= 0")
        if pending_ttl < 0:
            raise ValueError("pending_ttl must be >= 0")
        if max_pending_per_engine <= 0:
            raise ValueError("max_pending_per_engine must be positive")
        self.max_blocks = max_blocks_per_engine
        self.silence_timeout = silence_timeout
        self.pending_ttl = pending_ttl
        self.max_pending = max_pending_per_engine
        self._clock = clock
        self._engines: dict[str, _Engine] = {}
        self._block_sizes: dict[str, int] = {}  # model -> block size its BlockStored events carry
        # model -> block hash -> engines holding it
        self._holders: dict[str, dict[BlockHash, set[str]]] = {}
        # model -> block hash -> engines it was sent to and that have not stored it yet
        self._pending: dict[str, dict[BlockHash, set[str]]] = {}

    # --- membership -------------------------------------------------------------------------

    def add_engine(self, engine: str, model: str) -> None:
        """Start tracking *engine* (idempotent; a model change starts it afresh)."""
        cur = self._engines.get(engine)
        if cur is not None and cur.model == model:
            return
        if cur is not None:
            self.remove_engine(engine)
        self._engines[engine] = _Engine(model)
        self._holders.setdefault(model, {})
        self._pending.setdefault(model, {})

    def remove_engine(self, engine: str) -> None:
        e = self._engines.pop(engine, None)
        if e is not None:
            self._drop_blocks(engine, e)

    def engines(self) -> list[str]:
        return list(self._engines)

    def has_engine(self, engine: str) -> bool:
        return engine in self._engines

    def model_of(self, engine: str) -> str:
        return self._engines[engine].model

    def last_seq(self, engine: str) -> int | None:
        return self._engines[engine].last_seq

    def is_stale(self, engine: str) -> bool:
        e = self._engines.get(engine)
        return e is None or e.stale or e.last_seq is None or self._silent(e)

    def expect_events(self, engine: str) -> None:
        """A prefill that stores new blocks was sent to *engine*: it should publish soon."""
        e = self._engines.get(engine)
        if e is not None and self.silence_timeout > 0 and e.awaiting_since is None:
            e.awaiting_since = self._clock()

    def _silent(self, e: _Engine) -> bool:
        return e.awaiting_since is not None and self._clock() - e.awaiting_since > self.silence_timeout

    def block_size(self, model: str) -> int | None:
        """The block size the model's engines report in ``BlockStored`` (None: none seen yet)."""
        return self._block_sizes.get(model)

    def mark_stale(self, engine: str) -> None:
        """The stream is down (disconnected, undecodable): stop trusting what we know."""
        e = self._engines.get(engine)
        if e is not None:
            e.stale = True
            self._drop_pending(engine, e)

    def mark_live(self, engine: str) -> None:
        """The stream is whole again (caught up after a reconnect): trust it, once it has a
        position (an engine that has published nothing since its restart stays unknown)."""
        e = self._engines.get(engine)
        if e is not None and e.last_seq is not None:
            e.stale = False
            e.awaiting_since = None

    def block_count(self, engine: str) -> int:
        return len(self._engines[engine].blocks)

    def pending_count(self, engine: str) -> int:
        """Blocks sent to *engine* and not yet stored nor expired."""
        e = self._engines[engine]
        self._expire(engine, e, self._clock())
        return len(e.pending)

    def add_pending(self, engine: str, hashes: Iterable[BlockHash]) -> None:
        """A prefill of these blocks was sent to *engine*: count them as held there until it
        reports them stored, or ``pending_ttl`` passes (blocks it already holds are skipped)."""
        e = self._engines.get(engine)
        if e is None or self.pending_ttl <= 0:
            return
        now = self._clock()
        self._expire(engine, e, now)
        pend = self._pending[e.model]
        until = now + self.pending_ttl
        for h in hashes:
            if h in e.blocks:
                continue
            if h in e.pending:
                e.pending.move_to_end(h)
            else:
                pend.setdefault(h, set()).add(engine)
            e.pending[h] = until
        while len(e.pending) > self.max_pending:
            old, _ = e.pending.popitem(last=False)
            self._unhold(pend, old, engine)

    def _expire(self, engine: str, e: _Engine, now: float) -> None:
        if not e.pending:
            return
        pend = self._pending[e.model]
        while e.pending:
            h, until = next(iter(e.pending.items()))
            if until > now:
                break
            del e.pending[h]
            self._unhold(pend, h, engine)

    def restarts(self, engine: str) -> int:
        return self._engines[engine].restarts

    # --- events -----------------------------------------------------------------------------

    def apply(
        self, engine: str, seq: int, batch: EventBatch, *, replayed: bool = False
    ) -> ApplyResult:
        """Apply one batch received live (PUB) or, with *replayed*, from the replay socket."""
        e = self._engines.get(engine)
        if e is None:
            raise KeyError(engine)
        e.awaiting_since = None  # it speaks
        if e.last_seq is not None:
            if not replayed and e.last_replayed and seq <= e.last_seq:
                # live copies of batches a replay already delivered (queued while it ran); a
                # restart meanwhile is caught by the reconnect's replay
                return Duplicate()
            if seq == 0 and not replayed:
                # A live stream only repeats 0 when the engine's publisher restarted.
                e.restarts += 1
                self._drop_blocks(engine, e)
            elif seq <= e.last_seq:
                # Replayed twice, or live batches queued while a replay already delivered them.
                return Duplicate()
            elif seq > e.last_seq + 1:
                e.stale = True
                return Gap(e.last_seq + 1)
        self._apply_events(engine, e, batch)
        e.last_seq = seq
        e.last_replayed = replayed
        e.stale = False
        return Applied()

    def restarted(self, engine: str) -> None:
        """The engine restarted (seen by the subscriber, e.g. its replay buffer went back): forget
        its blocks; the next batch of any sequence number starts it afresh."""
        e = self._engines[engine]
        e.restarts += 1
        self._drop_blocks(engine, e)
        e.last_seq = None

    def resync(self, engine: str, seq: int) -> None:
        """The batches before *seq* are lost for good: forget the engine's blocks and continue
        from *seq* (the next :meth:`apply` must carry *seq*)."""
        e = self._engines[engine]
        self._drop_blocks(engine, e)
        e.last_seq = seq - 1 if seq > 0 else None
        e.stale = False

    def _apply_events(self, engine: str, e: _Engine, batch: EventBatch) -> None:
        holders = self._holders[e.model]
        pend = self._pending[e.model]
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                if ev.block_size > 0:
                    self._block_sizes[e.model] = ev.block_size
                for h in ev.block_hashes:
                    if e.pending.pop(h, None) is not None:
                        self._unhold(pend, h, engine)
                    if h in e.blocks:
                        e.blocks.move_to_end(h)
                        continue
                    e.blocks[h] = None
                    holders.setdefault(h, set()).add(engine)
                while len(e.blocks) > self.max_blocks:
                    old, _ = e.blocks.popitem(last=False)
                    self._unhold(holders, old, engine)
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    if e.pending.pop(h, None) is not None:
                        self._unhold(pend, h, engine)
                    if h in e.blocks:
                        del e.blocks[h]
                        self._unhold(holders, h, engine)
            elif isinstance(ev, AllBlocksCleared):
                self._drop_blocks(engine, e)

    @staticmethod
    def _unhold(holders: dict[BlockHash, set[str]], h: BlockHash, engine: str) -> None:
        s = holders.get(h)
        if s is not None:
            s.discard(engine)
            if not s:
                del holders[h]

    def _drop_blocks(self, engine: str, e: _Engine) -> None:
        holders = self._holders.get(e.model, {})
        for h in e.blocks:
            self._unhold(holders, h, engine)
        e.blocks.clear()
        self._drop_pending(engine, e)

    def _drop_pending(self, engine: str, e: _Engine) -> None:
        pend = self._pending.get(e.model, {})
        for h in e.pending:
            self._unhold(pend, h, engine)
        e.pending.clear()

    # --- lookup -----------------------------------------------------------------------------

    def prefix_lengths(
        self, model: str, hashes: Iterable[BlockHash], engines: Iterable[str]
    ) -> dict[str, int]:
        """For each of *engines*: how many leading blocks of *hashes* it holds or has pending
        (:meth:`add_pending`; 0 for an unknown or stale engine). Walks the chain once, stopping
        when no candidate holds the next block."""
        holders = self._holders.get(model, {})
        pending = self._pending.get(model, {})
        live = {
            name
            for name in engines
            if (e := self._engines.get(name)) is not None
            and e.model == model
            and not e.stale
            and e.last_seq is not None
            and not self._silent(e)
        }
        out = dict.fromkeys(engines, 0)
        if not live:
            return out
        now = self._clock()
        for name in live:
            self._expire(name, self._engines[name], now)
        depth = 0
        for h in hashes:
            have = holders.get(h)
            sent = pending.get(h)
            if sent:
                have = have | sent if have else sent
            if not have:
                break
            live &= have
            if not live:
                break
            depth += 1
            for name in live:
                out[name] = depth
        return out
