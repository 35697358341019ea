"""Strict, role-organised nodemanager configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from motor_common.errors import ConfigError
from motor_nodemanager import config as nmconfig


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "nm.yaml"
    p.write_text(text)
    return str(p)


def test_defaults_follow_the_spec_names_and_values(tmp_path: Path) -> None:
    cfg = nmconfig.load(write(tmp_path, "role: prefill\n"), environ={})
    assert cfg.heartbeat_interval_seconds == 3.0
    assert cfg.daemon_loop_interval == 5.0
    ft = cfg.fault_tolerance_config
    assert (ft.enable_engine_relaunch, ft.engine_restart_wait_timeout_sec, ft.engine_restart_freeze_sec) == (
        True, 180.0, 720.0,
    )  # fmt: skip
    h = cfg.health
    assert (h.poll_interval_sec, h.timeout_sec, h.port_wait_sec, h.startup_grace_sec, h.abnormal_threshold,
            h.failure_threshold) == (1.0, 5.0, 60.0, 120.0, 5, 3)  # fmt: skip
    assert cfg.ip == "127.0.0.1"


@pytest.mark.parametrize("value", [0, 101])
def test_failure_threshold_out_of_range_is_rejected_naming_it(tmp_path: Path, value: int) -> None:
    with pytest.raises(ConfigError, match=r"health\.failure_threshold must be between 1 and 100"):
        nmconfig.load(write(tmp_path, f"health: {{failure_threshold: {value}}}\n"), environ={})


def test_unknown_key_is_rejected_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"health\.poll_intervall_sec"):
        nmconfig.load(write(tmp_path, "role: decode\nhealth:\n  poll_intervall_sec: 1\n"), environ={})


def test_unknown_key_inside_a_role_section_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"decode\.mgmt_port"):
        nmconfig.load(write(tmp_path, "role: decode\ndecode:\n  mgmt_port: 1\n"), environ={})


def test_role_section_overrides_top_level_for_that_role_only(tmp_path: Path) -> None:
    text = (
        "endpoints_per_node: 1\nprefill:\n  endpoints_per_node: 2\n  engine:\n    extra_args: ['--x']\n"
        "decode:\n  endpoints_per_node: 4\n"
    )
    path = write(tmp_path, text)
    p = nmconfig.load(path, environ={"ROLE": "prefill"})
    d = nmconfig.load(path, environ={"ROLE": "decode"})
    assert (p.role, p.endpoints_per_node, p.engine.extra_args) == ("prefill", 2, ["--x"])
    assert (d.role, d.endpoints_per_node, d.engine.extra_args) == ("decode", 4, [])


def test_role_is_required_from_config_or_env(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="role is not set"):
        nmconfig.load(write(tmp_path, "job_name: j\n"), environ={})


def test_ip_defaults_to_pod_ip_and_env_overrides_apply(tmp_path: Path) -> None:
    env = {"POD_IP": "10.0.0.7", "MOTOR_NODEMANAGER__HEALTH__ABNORMAL_THRESHOLD": "3", "ROLE": "union",
           "MOTOR_NODEMANAGER__SERVER__HOST": "0.0.0.0"}
    cfg = nmconfig.load(write(tmp_path, "job_name: j\n"), environ=env)
    assert cfg.ip == "10.0.0.7" and cfg.server.host == "0.0.0.0"
    assert cfg.health.abnormal_threshold == 3


def test_advertising_a_pod_ip_while_bound_to_loopback_is_a_config_error(tmp_path: Path) -> None:
    env = {"POD_IP": "10.0.0.7", "ROLE": "union"}  # server.host left at its default 127.0.0.1
    with pytest.raises(ConfigError, match=r"server.host 127.0.0.1 is a loopback address but this node advertises ip 10.0.0.7"):
        nmconfig.load(write(tmp_path, "job_name: j\n"), environ=env)
    cfg = nmconfig.load(write(tmp_path, "job_name: j\nserver: {host: 10.0.0.7}\n"), environ=env)
    assert (cfg.server.host, cfg.ip) == ("10.0.0.7", "10.0.0.7")
    assert nmconfig.load(write(tmp_path, "job_name: j\n"), environ={"ROLE": "union"}).ip == "127.0.0.1"


def test_bad_enum_and_bad_ranges_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="visible_devices_env"):
        nmconfig.load(write(tmp_path, "role: union\nvisible_devices_env: GPUS\n"), environ={})
    with pytest.raises(ConfigError, match="node_rank"):
        nmconfig.load(write(tmp_path, "role: union\nnode_rank: 2\nnodes_per_instance: 2\n"), environ={})
    with pytest.raises(ConfigError, match="mode"):
        nmconfig.load(write(tmp_path, "role: union\nkv_cache_store_config: {mode: split}\n"), environ={})


def test_config_path_prefers_user_config_then_config_then_cli() -> None:
    assert nmconfig.config_path("c", {"USER_CONFIG_PATH": "u", "CONFIG_PATH": "p"}) == "u"
    assert nmconfig.config_path("c", {"CONFIG_PATH": "p"}) == "p"
    assert nmconfig.config_path("c", {}) == "c"


def test_restart_needed_names_listen_keys_but_not_hot_ones(tmp_path: Path) -> None:
    a = nmconfig.load(write(tmp_path, "role: union\n"), environ={})
    b = nmconfig.load(
        write(tmp_path, "role: union\nheartbeat_interval_seconds: 1\nserver: {port: 9999}\n"), environ={}
    )
    assert nmconfig.restart_needed(a, b) == ["server"]


def test_kv_events_section_defaults_off_and_needs_room_for_five_ports_per_endpoint(tmp_path: Path) -> None:
    cfg = nmconfig.load(write(tmp_path, "role: prefill\n"), environ={})
    assert cfg.engine.kv_events.enable is False and cfg.engine.kv_events.topic == "kv-events"
    on = nmconfig.load(write(tmp_path, "role: prefill\nengine: {kv_events: {enable: true, topic: t, replay: false}}\n"),
                       environ={})  # fmt: skip
    assert (on.engine.kv_events.enable, on.engine.kv_events.topic, on.engine.kv_events.replay) == (True, "t", False)
    nmconfig.load(write(tmp_path, "role: prefill\nbase_port: 65530\nendpoints_per_node: 2\n"), environ={})
    with pytest.raises(ConfigError, match="base_port"):
        nmconfig.load(write(tmp_path, "role: prefill\nbase_port: 65530\nendpoints_per_node: 2\n"
                                      "engine: {kv_events: {enable: true}}\n"), environ={})  # fmt: skip
    with pytest.raises(ConfigError, match="kv_events"):
        nmconfig.load(write(tmp_path, "role: prefill\nengine: {kv_events: {enabled: true}}\n"), environ={})
