from __future__ import annotations

from motor_controller.config import FaultToleranceConfig
from motor_controller.fault_policy import (
    DP_SCALE_DOWN,
    ENGINE_RELAUNCH,
    NODE_RESTART,
    choose_strategy,
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
    assert choose_strategy(fault("engine_unhealthy"), on) is None
    assert choose_strategy(fault(), FaultToleranceConfig(enable_fault_tolerance=True, enable_dp_scale_down=True)) == DP_SCALE_DOWN


def test_failed_strategy_escalates() -> None:
    on = FaultToleranceConfig(enable_fault_tolerance=True)
    assert choose_strategy(fault("engine_unhealthy"), on, previous_failed=DP_SCALE_DOWN) == ENGINE_RELAUNCH
    assert choose_strategy(fault(), on, previous_failed=ENGINE_RELAUNCH) == NODE_RESTART
