"""Admission control of the OpenAI front: bounded concurrency and bounded queues per model and per
API key, so that an overload is answered early (429 with ``Retry-After``) instead of piling up
in the engines until they collapse.

A request needs a slot in its model's bucket and in its key's bucket (the inference key's name;
one anonymous bucket when the front has no keys). While both have a free in-flight slot it is
admitted at once (each release grants every waiter that can run, in arrival order, so a free
pair of slots means nobody waiting could use them); else it waits, if both queues have
room; else it is shed.
The bodies of admitted requests share a byte budget (``max_in_flight_bytes``), the front's
memory bound: a request that would pass it waits, and requests behind it do not overtake it.
A queued request that does not get a slot within ``queue_timeout_sec`` is shed too. Limits are
per process (each coordinator's co-located front, each gateway worker: a gateway with several
workers gives each its share of the request counts, ``motor_common.worker_policy``). No I/O; the waits are
asyncio futures. Buckets exist only while they hold requests, so client-chosen model names cannot
grow memory.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from motor_common.openai_front import metrics

MIB = 1024 * 1024


@dataclass(frozen=True)
class AdmissionConfig:
    # Requests of one model served at once by this process (what the engines get); 0 = unbounded.
    max_in_flight_per_model: int = 512
    # Requests of one model waiting for a slot; beyond it → 429. 0 = no waiting (429 when busy).
    max_queued_per_model: int = 512
    # The same per API key (one anonymous key when the front has none); 0 = unbounded.
    max_in_flight_per_key: int = 512
    max_queued_per_key: int = 512
    # Seconds a request may wait for a slot before it is shed (429).
    queue_timeout_sec: float = 30.0
    # Bodies of all admitted requests together (an admitted request costs the front about four
    # times its body while it is parsed, re-encoded and relayed); a request that would pass it
    # waits. One request is always admitted when nothing else is in flight. 0 = unbounded.
    max_in_flight_bytes: int = 16 * MIB
    # Request bodies the process holds at once, from the first byte read to the end of the
    # response (being read, queued or in flight); a request whose arriving bytes would pass it →
    # 429 at once (the front's memory bound; charged as bytes arrive, so connections that
    # declare large bodies and send nothing hold nothing). 0 = unbounded.
    max_buffered_bytes: int = 32 * MIB
    # The Retry-After header of a 429, seconds.
    retry_after_sec: int = 1

    def __post_init__(self) -> None:
        for name in ("max_in_flight_per_model", "max_queued_per_model", "max_in_flight_per_key",
                     "max_queued_per_key", "max_in_flight_bytes", "max_buffered_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"admission.{name} must be >= 0")
        if self.queue_timeout_sec <= 0 or self.retry_after_sec < 1:
            raise ValueError("admission.queue_timeout_sec must be > 0 and retry_after_sec >= 1")


class Shed(Exception):
    """The request is refused: ``reason`` is queue_full, queue_timeout or buffered_bytes."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class _Bucket:
    __slots__ = ("in_flight", "max_in_flight", "max_queued", "queued")

    def __init__(self, max_in_flight: int, max_queued: int) -> None:
        self.in_flight = 0
        self.queued = 0
        self.max_in_flight = max_in_flight
        self.max_queued = max_queued

    def free(self) -> bool:
        return self.max_in_flight == 0 or self.in_flight < self.max_in_flight

    def idle(self) -> bool:
        return self.in_flight == 0 and self.queued == 0


@dataclass(eq=False)
class Ticket:
    """An admitted request; give it back with :meth:`Admission.release`."""

    model: str
    key: str
    size: int = 0
    released: bool = False


@dataclass(eq=False)
class _Waiter:
    ticket: Ticket
    size: int
    future: asyncio.Future[None]


class Admission:
    def __init__(self, cfg: AdmissionConfig) -> None:
        self.cfg = cfg
        self._models: dict[str, _Bucket] = {}
        self._keys: dict[str, _Bucket] = {}
        self._waiters: deque[_Waiter] = deque()
        self.queued_bytes = 0
        self.in_flight_bytes = 0
        self._bytes_blocked = 0

    def _fits(self, size: int) -> bool:
        limit = self.cfg.max_in_flight_bytes
        return limit == 0 or self.in_flight_bytes == 0 or self.in_flight_bytes + size <= limit

    def _buckets(self, model: str, key: str) -> tuple[_Bucket, _Bucket]:
        c = self.cfg
        m = self._models.get(model)
        if m is None:
            m = self._models[model] = _Bucket(c.max_in_flight_per_model, c.max_queued_per_model)
        k = self._keys.get(key)
        if k is None:
            k = self._keys[key] = _Bucket(c.max_in_flight_per_key, c.max_queued_per_key)
        return m, k

    def in_flight(self, model: str) -> int:
        b = self._models.get(model)
        return b.in_flight if b else 0

    def queued(self, model: str) -> int:
        b = self._models.get(model)
        return b.queued if b else 0

    async def acquire(self, model: str, key: str, size: int) -> Ticket:
        """A slot for one request of *model* sent with API key *key* whose body has *size*
        bytes; waits in line when the buckets are full. Raises :class:`Shed`."""
        m, k = self._buckets(model, key)
        ticket = Ticket(model, key, size)
        if m.free() and k.free() and self._fits(size) and not self._waiters_for_bytes():
            self._take(m, k, size)
            metrics.ADMITTED.inc()
            return ticket
        c = self.cfg
        full = ("model", m) if m.max_queued and m.queued >= m.max_queued else \
            ("API key", k) if k.max_queued and k.queued >= k.max_queued else None
        if full is not None or (c.max_queued_per_model == 0 and not m.free()) \
                or (c.max_queued_per_key == 0 and not k.free()):
            self._forget(model, key)
            what = full[0] if full else "model"
            raise self._shed("queue_full", f"too many requests for this {what} are waiting; retry later")
        waiter = _Waiter(ticket, size, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        if m.free() and k.free():
            self._bytes_blocked = 1  # waiting for the byte budget only
        m.queued += 1
        k.queued += 1
        self.queued_bytes += size
        metrics.QUEUED.inc()
        metrics.QUEUED_TOTAL.inc()
        try:
            async with asyncio.timeout(c.queue_timeout_sec):
                await asyncio.shield(waiter.future)
        except BaseException as exc:
            if waiter.future.done() and not waiter.future.cancelled():
                if not isinstance(exc, TimeoutError):
                    self.release(ticket)  # granted while we were being cancelled
                    raise
                metrics.ADMITTED.inc()
                return ticket  # granted at the deadline: keep it
            waiter.future.cancel()
            self._unqueue(waiter, m, k)
            self._wake()  # re-decide: it may have been the one holding the byte budget's line
            self._forget(model, key)
            if isinstance(exc, TimeoutError):
                raise self._shed("queue_timeout", f"no capacity for this request within "
                                 f"{c.queue_timeout_sec:g}s; retry later") from None
            raise
        metrics.ADMITTED.inc()
        return ticket

    def release(self, ticket: Ticket) -> None:
        if ticket.released:
            return
        ticket.released = True
        m, k = self._models[ticket.model], self._keys[ticket.key]
        m.in_flight -= 1
        k.in_flight -= 1
        self.in_flight_bytes -= ticket.size
        metrics.ADMITTED_IN_FLIGHT.dec()
        self._wake()
        self._forget(ticket.model, ticket.key)

    # -- internals -------------------------------------------------------------------------------

    def _take(self, m: _Bucket, k: _Bucket, size: int) -> None:
        m.in_flight += 1
        k.in_flight += 1
        self.in_flight_bytes += size
        metrics.ADMITTED_IN_FLIGHT.inc()

    def _waiters_for_bytes(self) -> bool:
        """Whether someone waits only for the byte budget (then newcomers queue behind them, so
        that small requests cannot starve a large one)."""
        return self._bytes_blocked > 0

    def _unqueue(self, waiter: _Waiter, m: _Bucket, k: _Bucket) -> None:
        try:
            self._waiters.remove(waiter)
        except ValueError:
            return  # already granted and removed by _wake
        m.queued -= 1
        k.queued -= 1
        self.queued_bytes -= waiter.size
        metrics.QUEUED.dec()

    def _wake(self) -> None:
        """Grant slots to waiters in arrival order (one whose bucket is still full does not block
        waiters of other buckets behind it)."""
        if not self._waiters:
            self._bytes_blocked = 0
            return
        keep: deque[_Waiter] = deque()
        blocked_m: set[str] = set()
        blocked_k: set[str] = set()
        bytes_blocked = 0
        while self._waiters:
            w = self._waiters.popleft()
            t = w.ticket
            m, k = self._models[t.model], self._keys[t.key]
            if w.future.done() or t.model in blocked_m or t.key in blocked_k or not (m.free() and k.free()) \
                    or bytes_blocked or not self._fits(w.size):
                if not w.future.done():
                    blocked_m.add(t.model)
                    blocked_k.add(t.key)
                    if m.free() and k.free() and not bytes_blocked and not self._fits(w.size):
                        bytes_blocked = 1  # FIFO on the byte budget: nobody behind overtakes it
                keep.append(w)
                continue
            m.queued -= 1
            k.queued -= 1
            self.queued_bytes -= w.size
            metrics.QUEUED.dec()
            self._take(m, k, w.size)
            w.future.set_result(None)
        self._waiters = keep
        self._bytes_blocked = bytes_blocked

    def _forget(self, model: str, key: str) -> None:
        m = self._models.get(model)
        if m is not None and m.idle():
            del self._models[model]
        k = self._keys.get(key)
        if k is not None and k.idle():
            del self._keys[key]

    def _shed(self, reason: str, message: str) -> Shed:
        metrics.SHED.labels(reason).inc()
        return Shed(reason, message)


class BodyBudget:
    """The bytes of request bodies held by the process (``max_buffered_bytes``): taken chunk by
    chunk as they arrive, and given back at the end of the request."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def reserve(self, n: int, held: int = 0) -> None:
        """Take *n* more bytes for a request already holding *held*; raises :class:`Shed` (a
        request is always allowed its first bytes when the process holds no other body)."""
        if self.limit and self.used + n > self.limit and self.used > held:
            metrics.SHED.labels("buffered_bytes").inc()
            raise Shed("buffered_bytes", "the server is holding too many request bodies; retry later")
        self.used += n

    def release(self, n: int) -> None:
        self.used -= n


class Hold:
    """One request's share of a :class:`BodyBudget`."""

    __slots__ = ("budget", "n")

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.n = 0

    def take(self, n: int) -> None:
        if n > 0:
            self.budget.reserve(n, self.n)
            self.n += n

    def free(self) -> None:
        self.budget.release(self.n)
        self.n = 0
