"""Is an engine alive, and may a request that failed on it be sent to another one? (pure, no I/O)

Every answer an engine gives (a response head, a body chunk, a passing health probe or metrics
scrape) is a *sign of life*. An attempt (one request sent to one engine) **stalls** when it has no
first byte while its engine has shown no sign of life for the first-byte deadline: the engine is
hung (frozen, busy-looping, or stopped), not merely slow on this request.

When an attempt stalls or its engine drops the connection under it, was it the victim or the
cause? A request that made its engine hang (a *poison* request) looks the same as one that was on
the engine when something else froze it: the engine may hang the instant the poison arrives, or
seconds later, while other requests are on it. Only a health probe proves that an engine was
already hung at a given moment (a healthy engine answers one within milliseconds), so:

* **innocent** — a health probe sent *before* this attempt, after the engine's last sign of life,
  got no answer: the attempt arrived at an engine that was already hung. Retry it elsewhere.
* **innocent** too — the engine's silence was *explained*: a request convicted as poison (it hung
  a second engine, see ``quarantine``) was on it, so the others on it were its victims.
* **suspect** — anything else: it was on the engine, or reached it before any probe showed it
  hung, so it may be what stopped it. What happens to suspects is ``quarantine``'s business:
  the suspects of one silence of one engine (one *episode*, named by :meth:`Liveness.episode`)
  are sent to another engine one at a time; a suspect of a dropped connection gets one more
  engine, not two (an engine killed from outside drops everything it serves at once).

Attempts are not used as evidence of each other: a slow innocent request sent just before an
instant poison would otherwise vouch for the poison.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Key = tuple[str, int]


@dataclass
class _Engine:
    last_alive: float
    # Send time of the earliest health probe that got no answer since last_alive.
    witness: float | None = None
    # A convicted poison request was on the engine in this silence: every attempt is its victim.
    explained: bool = False


@dataclass(frozen=True, slots=True)
class Attempt:
    key: Key
    sent_at: float


class Liveness:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._engines: dict[Key, _Engine] = {}

    def _engine(self, key: Key) -> _Engine:
        e = self._engines.get(key)
        if e is None:
            e = self._engines[key] = _Engine(last_alive=self._clock())
        return e

    def forget(self, keep: set[Key]) -> None:
        """Drop the engines not in *keep* (the registry changed)."""
        for key in [k for k in self._engines if k not in keep]:
            del self._engines[key]

    # -- events ----------------------------------------------------------------------------

    def sent(self, key: Key) -> Attempt:
        self._engine(key)
        return Attempt(key, self._clock())

    def alive(self, key: Key) -> None:
        """The engine answered something (a head, a chunk, a probe, a scrape)."""
        e = self._engine(key)
        e.last_alive = self._clock()
        e.witness = None
        e.explained = False

    def probe_failed(self, key: Key, sent_at: float) -> None:
        """A health probe sent at *sent_at* got no passing answer."""
        e = self._engine(key)
        if sent_at > e.last_alive:
            e.witness = sent_at if e.witness is None else min(e.witness, sent_at)

    def explain(self, key: Key) -> None:
        """A request convicted as poison hung the engine: its current silence is explained, every
        attempt on it until it is alive again is innocent."""
        self._engine(key).explained = True

    # -- questions -------------------------------------------------------------------------

    def episode(self, key: Key) -> float:
        """Names the engine's current silence (its last sign of life): the attempts stalled in one
        episode form one suspect group."""
        return self._engine(key).last_alive

    def silent_for(self, a: Attempt) -> float:
        """Seconds the engine has given no sign of life while *a* waited for its first byte."""
        e = self._engine(a.key)
        return self._clock() - max(a.sent_at, e.last_alive)

    def alive_since(self, key: Key, t: float) -> bool:
        """The engine gave a sign of life after *t* (e.g. streamed a chunk while a probe waited)."""
        e = self._engines.get(key)
        return e is not None and e.last_alive > t

    def innocent(self, a: Attempt) -> bool:
        """*a* reached an engine a probe had already found silent, or the engine's silence was
        explained by a convicted poison request (see the module docstring)."""
        e = self._engine(a.key)
        return e.explained or (e.witness is not None and e.witness < a.sent_at)
