"""The ``motor-coordinator`` console script: strict config, ports file, ops endpoint, SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import tool
from tests.procs import http_status, start_coordinator


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"scheduler": {"polcy": "round_robin"}}, "scheduler.polcy"),
        ({"scheduler": {"policy": "fastest"}}, "unknown policy 'fastest'"),
        ({"dispatch": {"prefill_retries": -1}}, "prefill_retries"),
        ({"dispatch": {"decode_retries": -1}}, "decode_retries"),
    ],
)
def test_bad_config_exits_2_naming_the_problem(tmp_path: Path, config: dict[str, object], needle: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    out = subprocess.run([tool("motor-coordinator"), "--config", str(path), "--port", "0"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2, out.stderr
    assert needle in out.stderr


async def test_ports_file_ops_endpoint_and_graceful_sigterm(tmp_path: Path) -> None:
    async with start_coordinator(tmp_path, {"server": {"metrics_port": 0}}) as c:
        assert c.ports["grpc"] == c.port and c.ports["metrics"]
        ops = f"http://127.0.0.1:{c.ports['metrics']}"
        assert http_status(ops + "/health") == 200
        assert http_status(ops + "/ready") == 503  # nothing registered yet
        assert http_status(ops + "/metrics") == 200
        c.popen.send_signal(signal.SIGTERM)
        assert c.popen.wait(timeout=15) == 0
