"""Fault-manager contract (next issue), pure: strategy selection and explicit strategy results.

A strategy is a pluggable object behind :class:`Strategy`; it runs while its instance is
RECOVERING (the pusher then shows the instance PAUSED to coordinators) and ends with an explicit
:class:`StrategyResult`. The fault manager feeds ``RECOVERY_DONE`` / ``RECOVERY_FAILED`` into the
instance state machine and, on ``FAILED``, remembers it so the next decision escalates
(seed: StrategyBase.mark_failed + prev_strategy_failed → engine relaunch). Every relaunch path is
gated by ``enable_engine_relaunch``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from motor_controller.config import FaultToleranceConfig
from motor_controller.model import FaultReport, ManagedInstance


class Outcome(enum.Enum):
    DONE = "done"  # instance healthy again
    FAILED = "failed"  # gave up: escalate on the next decision
    ABORTED = "aborted"  # interrupted (instance deleted, controller stopping)


@dataclass(frozen=True)
class StrategyResult:
    outcome: Outcome
    detail: str = ""


class Strategy(Protocol):
    name: str

    async def run(self, instance: ManagedInstance) -> StrategyResult: ...
    async def stop(self) -> None: ...


class FtState(enum.Enum):
    IDLE = "idle"
    RUNNING = "running"
    FAILED = "failed"


@dataclass
class Progress:
    """What a strategy reports while it runs (read by GetFaultToleranceStatus); one per instance."""

    strategy: str = ""
    phase: str = ""
    state: FtState = FtState.IDLE
    relaunch_attempts: int = 0
    last_error: str = ""


ENGINE_RELAUNCH = "engine_relaunch"
NODE_RESTART = "node_restart"
DP_SCALE_DOWN = "dp_scale_down"
AWAIT_RECOVERY = "await_recovery"

# Strategies that expect the engine to recover without a restart: when one fails, the fault is still
# there and nobody will report it again, so the fault manager takes the next decision at once.
NO_RESTART_STRATEGIES = frozenset({AWAIT_RECOVERY, DP_SCALE_DOWN})


def choose_strategy(
    report: FaultReport, config: FaultToleranceConfig, *, previous_failed: str | None = None,
    scale_down_eligible: bool = True,
) -> str | None:
    """Name of the strategy for *report*, or None (leave it to heartbeats/self-termination).

    ENGINE_DEAD → DP scale-down only when it is on *and* the instance is eligible
    (``scale_down.eligible``: data-parallel, every node capable, a survivor left); else relaunch."""
    if not config.enable_fault_tolerance:
        return None
    if previous_failed is not None and previous_failed != ENGINE_RELAUNCH:
        return ENGINE_RELAUNCH if config.enable_engine_relaunch else NODE_RESTART
    if previous_failed == ENGINE_RELAUNCH:
        return NODE_RESTART
    if report.level == "engine_dead":
        if config.enable_dp_scale_down and scale_down_eligible:
            return DP_SCALE_DOWN
        return ENGINE_RELAUNCH if config.enable_engine_relaunch else None
    if report.level == "engine_unhealthy":
        return AWAIT_RECOVERY  # never a relaunch directly: only its failure escalates
    return None


def escalation(failed: str, config: FaultToleranceConfig, *, dead_scale_down_eligible: bool = False) -> str | None:
    """The strategy to run at once after *failed* (a no-restart strategy) failed, or None.

    An await-recovery ended by an engine death decides as a fresh ENGINE_DEAD would: DP scale-down
    when it is on and the death is eligible (*dead_scale_down_eligible*), else relaunch."""
    if failed not in NO_RESTART_STRATEGIES or not config.enable_fault_tolerance:
        return None
    if failed == AWAIT_RECOVERY and config.enable_dp_scale_down and dead_scale_down_eligible:
        return DP_SCALE_DOWN
    return ENGINE_RELAUNCH if config.enable_engine_relaunch else NODE_RESTART


def relaunch_expected(strategy: str, config: FaultToleranceConfig) -> bool:
    """Whether the nodes should freeze self-termination while *strategy* handles their fault.

    True for an engine relaunch, and for a no-restart strategy whose failure escalates to one."""
    if strategy == ENGINE_RELAUNCH:
        return True
    return strategy in NO_RESTART_STRATEGIES and config.enable_engine_relaunch
