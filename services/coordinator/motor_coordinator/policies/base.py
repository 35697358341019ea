"""What a scheduling policy sees and the Protocol every policy implements (pure)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from motor_common.domain import Endpoint, Instance, Role


@dataclass(frozen=True)
class EngineLoad:
    """Gauges scraped from an engine's ``/metrics``."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0  # 0..1


@dataclass(frozen=True)
class Candidate:
    """One schedulable endpoint of one instance, with its current load."""

    instance: Instance
    endpoint: Endpoint
    inflight: int = 0
    load: EngineLoad | None = None
    # Prompt tokens this coordinator's prefills in flight on the endpoint will compute (as the
    # policy estimated them when it chose: see ``PrefillChoice``); 0 when not estimated.
    queued_tokens: int = 0

    @property
    def key(self) -> str:
        return candidate_key(self.instance, self.endpoint)


def candidate_key(instance: Instance, endpoint: Endpoint) -> str:
    """:attr:`Candidate.key`: what hashing policies hash an endpoint by."""
    return f"{instance.id}/{endpoint.host_port}"


@dataclass(frozen=True)
class RequestInfo:
    """What a policy may know about the request."""

    seq: int
    model: str
    # The first characters of the rendered prompt ("" when none).
    prefix: str = ""
    # The prompt's token ids when known (a completions prompt given as ids); kv_events hashes them.
    token_ids: tuple[int, ...] | None = None


_T = TypeVar("_T")


class LiveSet(Protocol):
    """The scheduler's prebuilt view of one (model, role)'s schedulable endpoints, in the same
    stable order as the candidates ``select`` would get, with an incrementally kept load index
    (see ``Scheduler``): lets a policy decide without building every candidate."""

    @property
    def model(self) -> str: ...

    @property
    def role(self) -> Role: ...

    @property
    def size(self) -> int: ...

    def tied(self) -> Sequence[int]:
        """Positions with the lowest :func:`load_score`, ascending."""
        ...

    def key_at(self, i: int) -> str:
        """:attr:`Candidate.key` of position *i*."""
        ...

    def score_at(self, i: int) -> float:
        """The current :func:`load_score` of position *i*."""
        ...

    def memo(self, build: Callable[[LiveSet], _T]) -> _T:
        """``build(self)``, computed once per live set and kept with it: an index a policy derives
        from the endpoints (e.g. a hash ring). The scheduler builds a new live set whenever the
        schedulable endpoints change (snapshot, breaker), so a memo never outlives its endpoints;
        load changes keep the set and its memos."""
        ...


class Policy(Protocol):
    name: str

    def select(self, role: Role, candidates: Sequence[Candidate], req: RequestInfo) -> Candidate:
        """Pick one of *candidates* (non-empty, in a stable order). Must not mutate anything
        (memoised indexes derived from the candidates aside)."""
        ...

    # Optional: ``select_index(role, live: LiveSet, req) -> int | None`` — the same choice as
    # ``select`` over the live set's candidates, as a position, in sub-linear time; None = not
    # possible for this request (the scheduler then builds the candidates and calls ``select``).
    # Optional: ``select_prefill(candidates, req) -> PrefillChoice`` — the prefill choice with the
    # prompt tokens it will compute there; the scheduler keeps them queued on the endpoint while
    # the prefill runs (``Candidate.queued_tokens``).


@dataclass(frozen=True)
class PrefillChoice:
    """A prefill endpoint and the prompt tokens it is expected to compute (uncached there)."""

    candidate: Candidate
    tokens: int = 0


def load_score(c: Candidate, kv_usage_weight: float) -> float:
    """Requests on the endpoint (our in-flight count or the engine's own, whichever is larger)."""
    return score(c.inflight, c.load, kv_usage_weight)


def score(inflight: int, load: EngineLoad | None, kv_usage_weight: float) -> float:
    engine = 0.0 if load is None else load.running + load.waiting
    kv = 0.0 if load is None else load.kv_usage * kv_usage_weight
    return max(float(inflight), engine) + kv
