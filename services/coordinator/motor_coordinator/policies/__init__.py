"""Scheduling policies, registered in one place. An unknown name is a start-up error."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from motor_common.errors import ConfigError
from motor_coordinator.config import SchedulerConfig
from motor_coordinator.kv_index import KvIndex
from motor_coordinator.policies.base import Candidate, EngineLoad, Policy, RequestInfo
from motor_coordinator.policies.kv_events import KvEvents
from motor_coordinator.policies.least_load import LeastLoad
from motor_coordinator.policies.prefix_aware import PrefixAware
from motor_coordinator.policies.round_robin import RoundRobin


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may read besides its configuration (built by the coordinator app)."""

    kv_index: KvIndex = field(default_factory=KvIndex)


POLICIES: dict[str, Callable[[SchedulerConfig, PolicyContext], Policy]] = {
    RoundRobin.name: lambda cfg, _: RoundRobin(cfg),
    LeastLoad.name: lambda cfg, _: LeastLoad(cfg),
    PrefixAware.name: lambda cfg, _: PrefixAware(cfg),
    KvEvents.name: lambda cfg, ctx: KvEvents(cfg, ctx.kv_index),
}

# Policies that route by the engines' KV events: the coordinator subscribes only for these.
NEEDS_KV_EVENTS = frozenset({KvEvents.name})


def make_policy(cfg: SchedulerConfig, ctx: PolicyContext | None = None) -> Policy:
    try:
        factory = POLICIES[cfg.policy]
    except KeyError:
        known = ", ".join(sorted(POLICIES))
        raise ConfigError(f"scheduler.policy: unknown policy {cfg.policy!r}; known policies: {known}") from None
    return factory(cfg, ctx or PolicyContext())


__all__ = ["NEEDS_KV_EVENTS", "POLICIES", "Candidate", "EngineLoad", "Policy", "PolicyContext", "RequestInfo",
           "make_policy"]
