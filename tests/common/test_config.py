"""Strict configuration loading: unknown keys and wrong types are start-up errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from motor_common.config import load_config
from motor_common.errors import ConfigError
from motor_common.grpc_server import ServerConfig


@dataclass(frozen=True)
class Inner:
    interval_sec: float = 1.0
    enabled: bool = True


@dataclass(frozen=True)
class Cfg:
    server: ServerConfig = field(default_factory=ServerConfig)
    inner: Inner = field(default_factory=Inner)
    policy: Literal["round_robin", "least_load"] = "round_robin"
    peers: list[str] = field(default_factory=list)
    name: str | None = None


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_yaml_and_json_files_load_into_nested_dataclasses(tmp_path: Path) -> None:
    y = write(tmp_path, "c.yaml", "server: {port: 5000}\ninner: {interval_sec: 2}\npeers: [a, b]\n")
    cfg = load_config(Cfg, y)
    assert cfg.server.port == 5000 and cfg.inner.interval_sec == 2.0 and cfg.peers == ["a", "b"]
    j = write(tmp_path, "c.json", '{"policy": "least_load"}')
    assert load_config(Cfg, j).policy == "least_load"


def test_unknown_key_is_rejected_with_its_path_and_a_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, "c.yaml", "inner: {intervl_sec: 2}\n")
    with pytest.raises(ConfigError) as err:
        load_config(Cfg, path)
    assert "unknown configuration key 'inner.intervl_sec'" in err.value.message
    assert "did you mean 'interval_sec'" in err.value.message
    assert str(path) in err.value.message


def test_wrong_types_and_literals_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"inner\.enabled: expected true or false"):
        load_config(Cfg, write(tmp_path, "a.yaml", "inner: {enabled: 'yes'}\n"))
    with pytest.raises(ConfigError, match=r"policy: 'fastest' is not one of"):
        load_config(Cfg, write(tmp_path, "b.yaml", "policy: fastest\n"))
    with pytest.raises(ConfigError, match="port 70000 is outside"):
        load_config(Cfg, write(tmp_path, "c.yaml", "server: {port: 70000}\n"))


def test_env_overrides_win_over_the_file_and_unknown_env_keys_fail(tmp_path: Path) -> None:
    path = write(tmp_path, "c.yaml", "server: {port: 5000}\n")
    env = {"MOTOR_X__SERVER__PORT": "6000", "MOTOR_X__INNER__ENABLED": "false", "OTHER": "1"}
    cfg = load_config(Cfg, path, env_prefix="MOTOR_X", environ=env)
    assert cfg.server.port == 6000 and cfg.inner.enabled is False
    with pytest.raises(ConfigError, match="unknown configuration key 'bogus'"):
        load_config(Cfg, None, env_prefix="MOTOR_X", environ={"MOTOR_X__BOGUS": "1"})


def test_unreadable_or_malformed_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(Cfg, tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(Cfg, write(tmp_path, "bad.yaml", "a: [\n"))
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(Cfg, write(tmp_path, "list.yaml", "- 1\n"))
