from __future__ import annotations

from motor_controller.config import FaultToleranceConfig
from motor_controller.fault_policy import (
    AWAIT_RECOVERY,
    DP_SCALE_DOWN,
    ENGINE_RELAUNCH,
    NODE_RESTART,
    choose_strategy,
    escalation,
    relaunch_expected,
)
from motor_controller.model import FaultReport


def fault(level: str = "engine_dead") -> FaultReport:
    return FaultReport("n", 1, 0, level, "process_exit", 0, "", 0.0)


def test_disabled_fault_tolerance_chooses_nothing() -> None:
    assert choose_strategy(fault(), FaultToleranceConfig()) is None


def test_engine_dead_relaunches_only_when_gated_on() -> None:
    on = FaultToleranceConfig(enable_fault_tolerance=True)
    assert choose_strategy(fault(), on) == ENGINE_RELAUNCH
    assert choose_strategy(fault(), FaultToleranceConfig(enable_fault_tolerance=True, enable_engine_relaunch=False)) is None
    assert choose_strategy(fault("engine_unhealthy"), on) == AWAIT_RECOVERY  # never a relaunch directly
    assert choose_strategy(fault(), FaultToleranceConfig(enable_fault_tolerance=True, enable_dp_scale_down=True)) == DP_SCALE_DOWN


def test_failed_strategy_escalates() -> None:
    on = FaultToleranceConfig(enable_fault_tolerance=True)
    assert choose_strategy(fault("engine_unhealthy"), on, previous_failed=DP_SCALE_DOWN) == ENGINE_RELAUNCH
    assert choose_strategy(fault(), on, previous_failed=ENGINE_RELAUNCH) == NODE_RESTART


def test_only_a_failed_no_restart_strategy_escalates_at_once_and_relaunch_is_gated() -> None:
    on = FaultToleranceConfig(enable_fault_tolerance=True)
    no_relaunch = FaultToleranceConfig(enable_fault_tolerance=True, enable_engine_relaunch=False)
    assert escalation(AWAIT_RECOVERY, on) == ENGINE_RELAUNCH
    assert escalation(AWAIT_RECOVERY, no_relaunch) == NODE_RESTART
    assert escalation(ENGINE_RELAUNCH, on) is None and escalation(NODE_RESTART, on) is None
    assert choose_strategy(fault(), on, previous_failed=AWAIT_RECOVERY) == ENGINE_RELAUNCH
    assert relaunch_expected(AWAIT_RECOVERY, on) and not relaunch_expected(AWAIT_RECOVERY, no_relaunch)
    assert relaunch_expected(ENGINE_RELAUNCH, on) and not relaunch_expected(NODE_RESTART, on)


def test_an_await_recovery_ended_by_an_eligible_death_escalates_to_dp_scale_down() -> None:
    # A dead rank's survivors report unhealthy at the same moment: whichever report wins the race,
    # the death decides as a fresh ENGINE_DEAD would.
    dp = FaultToleranceConfig(enable_fault_tolerance=True, enable_dp_scale_down=True)
    assert escalation(AWAIT_RECOVERY, dp, dead_scale_down_eligible=True) == DP_SCALE_DOWN
    assert escalation(AWAIT_RECOVERY, dp, dead_scale_down_eligible=False) == ENGINE_RELAUNCH
    on = FaultToleranceConfig(enable_fault_tolerance=True)
    assert escalation(AWAIT_RECOVERY, on, dead_scale_down_eligible=True) == ENGINE_RELAUNCH
    assert escalation(DP_SCALE_DOWN, dp, dead_scale_down_eligible=True) == ENGINE_RELAUNCH
