"""CLI parsing: engine flags accepted, unknown flags rejected like the engines (exit 2)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from motor_sim.cli import parse
from motor_sim.config import Flavour, Role

from .conftest import MOTOR_SIM


def test_vllm_serve_flags_build_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", "6000")
    monkeypatch.setenv("VLLM_HOST_IP", "10.0.0.5")
    monkeypatch.delenv("VLLM_NIXL_SIDE_CHANNEL_HOST", raising=False)
    cfg = parse(["vllm", "serve", "/models/x", "--served-model-name", "a", "b",
                 "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}',
                 "--data-parallel-size", "4", "--data-parallel-rank", "2",
                 "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "13345",
                 "--tensor-parallel-size", "2", "--max-num-seqs", "8", "--max-model-len", "1024",
                 "--dtype", "bfloat16", "--seed", "3", "--sim-zero-latency", "--sim-prefill-slots", "1"])
    assert cfg.flavour is Flavour.VLLM and cfg.role is Role.PREFILL
    assert cfg.served_model_names == ("a", "b") and cfg.model == "/models/x"
    assert (cfg.dp_size, cfg.dp_rank, cfg.tp_size, cfg.max_num_seqs) == (4, 2, 2, 8)
    assert cfg.side_channel_port == 6002 and cfg.side_channel_host == "10.0.0.5"
    assert cfg.cost.zero_latency and cfg.cost.prefill_slots == 1


def test_sglang_flags_build_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOTOR_SIM_DECODE_MS_PER_TOKEN", "9")
    cfg = parse(["sglang", "--model-path", "m", "--disaggregation-mode", "decode",
                 "--disaggregation-bootstrap-port", "9000", "--disaggregation-transfer-backend",
                 "nixl", "--dp-size", "2", "--tp-size", "4", "--max-running-requests", "5"])
    assert cfg.flavour is Flavour.SGLANG and cfg.role is Role.DECODE
    assert (cfg.bootstrap_port, cfg.dp_size, cfg.tp_size, cfg.max_num_seqs) == (9000, 2, 4, 5)
    assert cfg.cost.decode_ms_per_token == 9.0 and cfg.cost.prefill_slots == 0


@pytest.mark.parametrize("argv", [
    ["vllm", "serve", "m", "--no-such-flag"],
    ["sglang", "--model-path", "m", "--bogus", "1"],
    ["sglang", "--model-path", "m", "--disaggregation-mode", "sideways"],
    ["vllm", "serve", "m", "--kv-transfer-config", "{not json"],
    ["vllm", "serve", "m", "--sim-fault", "explode"],
    ["vllm", "serve", "m", "--sim-prefill-slots", "-1"],
    # like real vLLM 0.32 (tests/realengine/test_launch_flags.py): an external DP rank needs size > 1
    ["vllm", "serve", "m", "--data-parallel-rank", "0"],
    ["vllm", "serve", "m", "--data-parallel-size", "1", "--data-parallel-rank", "0"],
    ["nonsense"],
])
def test_bad_command_lines_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_unknown_flag_exits_2_with_argparse_error_from_the_console_script() -> None:
    out = subprocess.run([MOTOR_SIM, "vllm", "serve", "m", "--frobnicate"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 2
    assert "unrecognized arguments: --frobnicate" in out.stderr


def test_python_dash_m_runs_the_same_cli() -> None:
    out = subprocess.run([sys.executable, "-m", "motor_sim", "sglang", "--help"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "--disaggregation-mode" in out.stdout


def test_refuse_start_fault_exits_non_zero() -> None:
    out = subprocess.run([MOTOR_SIM, "vllm", "serve", "m", "--sim-fault", "refuse_start",
                          "--port", "0"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "refusing to start" in out.stderr
