"""``motor-gateway``'s configuration refuses a front-wide admission limit its workers cannot split
(``motor_common.worker_policy.admission_too_small``)."""

from __future__ import annotations

import pytest

from motor_common.config import load_config
from motor_common.errors import ConfigError
from motor_gateway.config import GatewayConfig


def test_the_gateway_config_refuses_it_at_start_up() -> None:
    with pytest.raises(ConfigError, match=r"admission.max_in_flight_per_model is 2 but workers is 4.*at least 4"):
        load_config(GatewayConfig, None, overrides={"workers": 4, "admission": {"max_in_flight_per_model": 2}})
    cfg = load_config(GatewayConfig, None, overrides={"workers": 4, "admission": {"max_in_flight_per_model": 4}})
    assert cfg.admission.max_in_flight_per_model == 4
