"""What a scheduling policy sees and the Protocol every policy implements (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

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

    @property
    def key(self) -> str:
        return f"{self.instance.id}/{self.endpoint.host_port}"


@dataclass(frozen=True)
class RequestInfo:
    """What a policy may know about the request."""

    seq: int
    model: str
    # The first characters of the rendered prompt ("" when none).
    prefix: str = ""


class Policy(Protocol):
    name: str

    def select(self, role: Role, candidates: Sequence[Candidate], req: RequestInfo) -> Candidate:
        """Pick one of *candidates* (non-empty, in a stable order). Must not mutate anything."""
        ...


def load_score(c: Candidate, kv_usage_weight: float) -> float:
    """Requests on the endpoint (our in-flight count or the engine's own, whichever is larger)."""
    engine = 0.0 if c.load is None else c.load.running + c.load.waiting
    kv = 0.0 if c.load is None else c.load.kv_usage * kv_usage_weight
    return max(float(c.inflight), engine) + kv
