"""The front workers' load on a shared-memory board (``http.workers`` > 1).

Each worker owns one row of a file the coordinator creates in its private directory and every
process maps (``mmap``, shared):
its in-flight requests and queued prompt tokens per engine endpoint, written in place whenever
they change (a few machine words, no message, no system call). A reader (another worker, or the
coordinator) sums the other rows when it is about to route, at most every ``refresh_sec`` (1 ms),
and hands the sum to its scheduler (``Scheduler.set_peer_loads``). So the view of the others is at
most that old, and nothing is sent per request. A read costs about 0.2 µs per endpoint and other
worker (``bench/load_board_read.py``: ~2.5 µs for 2 endpoints, ~215 µs for 1,000 endpoints and 2
workers); the next read waits at least ``READ_BUDGET`` times as long as the last one took, so
reading stays under about a tenth of a worker's time on a large fleet (its view is then older:
~2 ms at 1,000 endpoints and 2 workers, ~8 ms with 16).

Layout: per row an 8-byte epoch, then ``MAX_ENDPOINTS`` pairs of int64 (in flight, tokens). The
endpoints' slots are their sorted order in the instance set, and the epoch a hash of that order:
every process computes both from the same instance set, and a row whose epoch is not the
reader's (its writer has not applied the same instance set yet) is skipped. Values are whole
aligned 8-byte words, so a reader sees each one either before or after a write; the row as a
whole may be a moment old, which a load view tolerates.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import time
from collections.abc import Callable, Iterable

from motor_common.domain import Instance
from motor_coordinator.scheduler import EndpointKey, endpoint_key

Load = tuple[int, int]  # (requests in flight, queued prompt tokens)

# Endpoints a board has slots for; the ones beyond (sorted last) are counted by their own worker only.
MAX_ENDPOINTS = 4096
_WORDS_PER_ROW = 1 + 2 * MAX_ENDPOINTS
# The next read is at least this many times the last read's duration away (≤ ~1/10 of the time reading).
READ_BUDGET = 10.0
ROW_BYTES = 8 * _WORDS_PER_ROW


def endpoint_keys(instances: Iterable[Instance]) -> list[EndpointKey]:
    """Every endpoint of an instance set (the board's slots)."""
    return [endpoint_key(ep) for inst in instances for ep in inst.endpoints]


def slot_order(keys: Iterable[EndpointKey]) -> tuple[list[EndpointKey], int]:
    """The endpoints' slot order and its epoch (a nonzero 63-bit hash of it)."""
    order = sorted(set(keys))[:MAX_ENDPOINTS]
    digest = hashlib.blake2b(repr(order).encode(), digest_size=8).digest()
    epoch = struct.unpack("<q", digest)[0] & 0x7FFF_FFFF_FFFF_FFFF
    return order, epoch or 1


class LoadBoard:
    """One process's handle on the board: *index* is its row (a worker), None for a reader only
    (the coordinator)."""

    def __init__(self, path: str, rows: int, index: int | None, *,
                 refresh_sec: float = 0.001, clock: Callable[[], float] = time.monotonic,
                 timer: Callable[[], float] = time.perf_counter) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, rows * ROW_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._buf = memoryview(self._map)
        self._words = self._buf.cast("q")
        self.path = path
        self.rows = rows
        self.index = index
        self.refresh_sec = refresh_sec
        self._clock = clock
        self._timer = timer  # measures how long a read takes (READ_BUDGET)
        self._order: list[EndpointKey] = []
        self._slot: dict[EndpointKey, int] = {}
        self._epoch = 0
        self._next_read = 0.0
        self._last: list[int] | None = None

    @classmethod
    def create(cls, path: str, rows: int) -> LoadBoard:
        """The coordinator's: a zeroed board of *rows* rows at *path* (mode 0600), read only."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, rows * ROW_BYTES)
        finally:
            os.close(fd)
        return cls(path, rows, None)

    def close(self) -> None:
        self._words.release()
        self._buf.release()
        self._map.close()

    # -- the instance set ---------------------------------------------------------------------

    def set_endpoints(self, keys: Iterable[EndpointKey], own: dict[EndpointKey, Load] | None = None) -> None:
        """A new instance set: new slots; this process's row is rewritten under them (*own*: its
        load now)."""
        self._order, epoch = slot_order(keys)
        self._slot = {k: i for i, k in enumerate(self._order)}
        self._epoch = epoch
        self._last = None
        self._next_read = 0.0
        if self.index is not None:
            base = self.index * _WORDS_PER_ROW
            w = self._words
            w[base] = 0  # readers skip the row while it is rewritten
            start = self.index * ROW_BYTES + 8
            self._buf[start: start + ROW_BYTES - 8] = bytes(ROW_BYTES - 8)
            for k, (n, t) in (own or {}).items():
                self.write(k, n, t)
            w[base] = epoch

    def clear_row(self, index: int) -> None:
        """Row *index*'s writer is gone (its worker died): its load no longer counts. An index
        outside the board (no worker of this coordinator) changes nothing."""
        if 0 <= index < self.rows:
            self._words[index * _WORDS_PER_ROW] = 0

    # -- writing and reading ------------------------------------------------------------------

    def write(self, key: EndpointKey, inflight: int, tokens: int) -> None:
        """This process's load on *key* now (not on the board: an endpoint beyond MAX_ENDPOINTS)."""
        slot = self._slot.get(key)
        if slot is None or self.index is None:
            return
        at = self.index * _WORDS_PER_ROW + 1 + 2 * slot
        self._words[at] = inflight
        self._words[at + 1] = tokens

    def others(self, *, force: bool = False) -> dict[EndpointKey, Load] | None:
        """The sum of every other row (of this epoch) per endpoint; None when it was read less than
        ``refresh_sec`` ago (unless *force*) or did not change since."""
        now = self._clock()
        if not force and now < self._next_read:
            return None
        started = self._timer()
        width = 2 * len(self._order)
        w = self._words
        rows = []
        for r in range(self.rows):
            if r == self.index:
                continue
            base = r * _WORDS_PER_ROW
            if w[base] != self._epoch:
                continue
            rows.append(w[base + 1: base + 1 + width].tolist())
        total = [sum(col) for col in zip(*rows, strict=True)] if rows else [0] * width
        self._next_read = now + max(self.refresh_sec, READ_BUDGET * (self._timer() - started))
        if total == self._last:
            return None
        self._last = total
        order = self._order
        return {order[i]: (total[2 * i], total[2 * i + 1]) for i in range(len(order))
                if total[2 * i] or total[2 * i + 1]}
