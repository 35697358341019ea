"""Strict configuration loading: unknown keys and wrong types are start-up errors."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from motor_common.config import load_config
from motor_common.errors import ConfigError
from motor_common.grpc_server import ServerConfig
from tests.conftest import tool


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


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(
            Cfg,
            write(tmp_path, "c.yaml", "server: {port: 5000}\ninner: {}\nserver: {port: 6000}\n"),
        )
    assert err.value.message.endswith(
        "is not valid YAML: key 'server' is given twice in one mapping (line 1 and line 3)"
    )
    with pytest.raises(ConfigError, match="not valid JSON: duplicate key 'port'"):
        load_config(Cfg, write(tmp_path, "c.json", '{"server": {"port": 5000, "port": 6000}}'))
    # a merge key's values may still be overridden
    cfg = load_config(
        Cfg, write(tmp_path, "m.yaml", "server: {<<: {port: 5000, host: 0.0.0.0}, port: 6000}\n")
    )
    assert (cfg.server.port, cfg.server.host) == (6000, "0.0.0.0")


def test_bytes_that_are_not_utf8_and_oversized_files_are_config_errors(tmp_path: Path) -> None:
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(byte 0xe9 at offset 9\)"):
        load_config(Cfg, latin)
    big = write(tmp_path, "big.yaml", "name: " + "x" * 1024 * 1024 + "\n")
    with pytest.raises(ConfigError, match="is larger than 1024 KiB"):
        load_config(Cfg, big)


def test_a_yaml_syntax_error_is_one_line_with_its_position(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(Cfg, write(tmp_path, "c.yaml", "inner:\n  enabled: true\n   bad: [\n"))
    assert (
        "\n" not in err.value.message and "is not valid YAML: line 3, column" in err.value.message
    )


def test_an_alias_bomb_in_a_wrong_type_is_refused_with_a_short_message(tmp_path: Path) -> None:
    levels = ['- &a0 ["x","x","x","x","x","x","x","x","x"]']
    levels += [f"- &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    path = write(
        tmp_path, "bomb.yaml", "name:\n" + "\n".join("  " + line for line in levels) + "\n"
    )
    with pytest.raises(ConfigError) as err:  # its repr alone: 9^9 strings (MemoryError before)
        load_config(Cfg, path)
    assert "name: expected a string, got [['x', 'x', 'x', 'x', ...]" in err.value.message
    assert len(err.value.message) < 300


@pytest.mark.parametrize(
    "text",
    ["inner: {interval_sec: .nan}", "inner: {interval_sec: .inf}", "inner: {interval_sec: -.inf}"],
)
def test_a_number_that_is_not_finite_is_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(
        ConfigError, match=r"inner\.interval_sec: expected a finite number, got -?(nan|inf)"
    ):
        load_config(Cfg, write(tmp_path, "c.yaml", text + "\n"))


def test_an_integer_too_large_for_a_float_or_for_python_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"inner\.interval_sec: expected a finite number, got 1000"
    ):
        load_config(
            Cfg, write(tmp_path, "c.yaml", "inner: {interval_sec: 1" + "0" * 400 + "}\n")
        )  # OverflowError
    with pytest.raises(
        ConfigError, match=r"big\.yaml is not valid YAML: Exceeds the limit \(4300 digits\)"
    ):
        load_config(
            Cfg, write(tmp_path, "big.yaml", "server: {port: 1" + "0" * 5000 + "}\n")
        )  # was "not valid JSON"


@pytest.mark.parametrize("value", ["-1", "1.0e+18", "31536001"])
def test_a_duration_below_zero_or_above_a_year_is_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(
        ConfigError,
        match=r"inner\.interval_sec: .* is not a duration in seconds from 0 to 31536000",
    ):
        load_config(Cfg, write(tmp_path, "c.yaml", f"inner: {{interval_sec: {value}}}\n"))
    assert (
        load_config(
            Cfg, write(tmp_path, "ok.yaml", "inner: {interval_sec: 31536000}\n")
        ).inner.interval_sec
        == 31536000
    )


HOSTILE = {
    "nonutf8.yaml": (
        b"log: {level: info}\n\xff\xfe: 1\n",
        "is not UTF-8 text (byte 0xff at offset 19)",
    ),
    "dup.yaml": (
        b"log: {level: info}\nlog: {level: debug}\n",
        "key 'log' is given twice in one mapping",
    ),
    "nan.yaml": (
        b"server: {grace_seconds: .nan}\n",
        "server.grace_seconds: expected a finite number, got nan",
    ),
    "huge.yaml": (
        b"server: {grace_seconds: 1.0e+18}\n",
        "server.grace_seconds: 1e+18 is not a duration in seconds",
    ),
}


@pytest.mark.parametrize(
    "program", ["motor-controller", "motor-coordinator", "motor-gateway", "motor-nodemanager"]
)
def test_every_program_refuses_a_hostile_config_file_in_one_line_with_exit_2(
    tmp_path: Path, program: str
) -> None:
    for name, (body, expected) in HOSTILE.items():
        if program == "motor-gateway" and name in ("nan.yaml", "huge.yaml"):
            body = body.replace(b"server: {grace_seconds:", b"shutdown_grace_sec:").replace(
                b"}", b""
            )
            expected = expected.replace("server.grace_seconds", "shutdown_grace_sec")
        path = tmp_path / name
        path.write_bytes(body)
        run = subprocess.run(
            [tool(program), "--config", str(path), "--check-config"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "ROLE": "prefill"},
        )
        assert run.returncode == 2, (name, run.stderr)
        assert run.stderr.count("\n") == 1 and run.stderr.startswith("error: "), (name, run.stderr)
        assert expected in run.stderr, (name, run.stderr)


@pytest.mark.parametrize(
    ("program", "body", "expected"),
    [
        # 70000 served /metrics on port 4464 (70000 mod 65536)
        ("motor-controller", "server: {metrics_port: 70000}", "server: metrics_port 70000 is outside [0, 65535]"),
        ("motor-coordinator", "server: {metrics_port: -1}", "server: metrics_port -1 is outside [0, 65535]"),
        # 0 probed both coordinators in a busy loop (95 % of a core)
        ("motor-gateway", "{coordinators: ['a:1', 'b:2'], probe_interval_sec: 0}",
         "probe_interval_sec must be at least 0.05 and probe_timeout_sec positive, got 0 and 0.5"),
        ("motor-gateway", "dispatch_attempts: 0", "dispatch_attempts must be at least 1 (the first try), got 0"),
        # 0 polled the config file in a busy loop (74 % of a core)
        ("motor-nodemanager", "config_watch_interval_sec: 0", "config_watch_interval_sec must be at least 0.05"),
        ("motor-nodemanager", "registration: {rpc_timeout_sec: 0}", "registration.rpc_timeout_sec must be > 0"),
        ("motor-nodemanager", "fault_tolerance_config: {zmq_pub_port: 70000}", "zmq_pub_port 70000 is outside"),
        # the scale-down guard's lease (their sum) above 3600 s: every GuardScaleDown refused OUT_OF_RANGE
        ("motor-controller", "fault_tolerance_config: {dp_scale_down_config: {execution_deadline_sec: 3600}}",
         "execution_deadline_sec + request_timeout_sec (the scale-down guard's lease) must be at most 3600 s"),
        ("motor-controller", "fault_tolerance_config: {dp_scale_down_config: {poll_interval_sec: 0}}",
         "poll_interval_sec and execution_deadline_sec must be > 0"),
    ],
)  # fmt: skip
def test_a_setting_that_would_spin_fail_every_call_or_bind_another_port_is_refused(
    tmp_path: Path, program: str, body: str, expected: str
) -> None:
    path = write(tmp_path, "c.yaml", body + "\n")
    run = subprocess.run([tool(program), "--config", str(path), "--check-config"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "ROLE": "prefill"})  # fmt: skip
    assert run.returncode == 2 and expected in run.stderr and run.stderr.count("\n") == 1, (
        run.stderr
    )


def test_a_named_pipe_nobody_writes_to_is_an_error_at_once_not_a_hang(tmp_path: Path) -> None:
    """``--config`` naming a FIFO with no writer blocked the program for ever in open()."""
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    run = subprocess.run([tool("motor-controller"), "--config", str(fifo), "--check-config"],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert run.stderr == f"error: config file {fifo} is a pipe with nothing written to it (does anything write to it?)\n"
    with pytest.raises(ConfigError, match="is not a regular file"):
        load_config(Cfg, tmp_path)  # a directory


def test_a_pipe_with_a_writer_is_read_to_its_end(tmp_path: Path) -> None:
    """Process substitution (``--config <(render)``): a pipe whose writer is slow is read whole."""
    r, w = os.pipe()
    writer = subprocess.Popen(["sh", "-c", "sleep 0.3; printf 'name: from-a-pipe\\n'"], stdout=w, pass_fds=())
    os.close(w)
    try:
        cfg = load_config(Cfg, f"/dev/fd/{r}")
    finally:
        os.close(r)
        writer.wait(10)
    assert cfg.name == "from-a-pipe"
