"""How fault recoveries end: ``motor_controller_recovery_results_total{strategy,outcome}``.

One count per strategy run (``await_recovery``, ``dp_scale_down``, ``engine_relaunch``,
``node_restart``) by its result: ``done`` (the instance is healthy again), ``failed`` (gave up;
the next decision escalates), ``aborted`` (instance deleted, controller stopping). Every pair is
exported from the start (0), so a rate or an alert over it has a series before the first fault.
"""

from __future__ import annotations

from prometheus_client import Counter

from motor_controller.fault_policy import (
    AWAIT_RECOVERY,
    DP_SCALE_DOWN,
    ENGINE_RELAUNCH,
    NODE_RESTART,
    Outcome,
    StrategyResult,
)

STRATEGIES = (AWAIT_RECOVERY, DP_SCALE_DOWN, ENGINE_RELAUNCH, NODE_RESTART)

RESULTS = Counter(
    "motor_controller_recovery_results",
    "Fault-recovery strategy runs by strategy (engine_relaunch, node_restart, dp_scale_down, "
    "await_recovery) and outcome (done, failed, aborted)",
    ["strategy", "outcome"],
)
for _s in STRATEGIES:
    for _o in Outcome:
        RESULTS.labels(_s, _o.value)


def record(strategy: str, result: StrategyResult) -> None:
    if strategy in STRATEGIES:  # bounded: only the registered strategies' names
        RESULTS.labels(strategy, result.outcome.value).inc()
