"""Scheduling policies, registered in one place. An unknown name is a start-up error."""

from __future__ import annotations

from collections.abc import Callable

from motor_common.errors import ConfigError
from motor_coordinator.config import SchedulerConfig
from motor_coordinator.policies.base import Candidate, EngineLoad, Policy, RequestInfo
from motor_coordinator.policies.least_load import LeastLoad
from motor_coordinator.policies.prefix_aware import PrefixAware
from motor_coordinator.policies.round_robin import RoundRobin

POLICIES: dict[str, Callable[[SchedulerConfig], Policy]] = {
    RoundRobin.name: RoundRobin,
    LeastLoad.name: LeastLoad,
    PrefixAware.name: PrefixAware,
}


def make_policy(cfg: SchedulerConfig) -> Policy:
    try:
        factory = POLICIES[cfg.policy]
    except KeyError:
        known = ", ".join(sorted(POLICIES))
        raise ConfigError(f"scheduler.policy: unknown policy {cfg.policy!r}; known policies: {known}") from None
    return factory(cfg)


__all__ = ["POLICIES", "Candidate", "EngineLoad", "Policy", "RequestInfo", "make_policy"]
