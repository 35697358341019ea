"""The ``motor-coordinator`` console script: strict config, ports file, ops endpoint, SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import aiohttp
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
        ({"http": {"port": 0, "limits": {"max_body_byts": 1}}}, "max_body_byts"),
        ({"http": {"port": 0, "limits": {"max_json_depth": 1}}}, "max_json_depth"),
        ({"http": {"port": 0, "admission": {"queue_timeout_sec": 0}}}, "queue_timeout_sec"),
        ({"http": {"workers": 2}}, "http.workers 2 needs the co-located front: set http.port"),
        ({"http": {"port": 0, "workers": 65}}, "http.workers must be in [1, 64]"),
        ({"http": {"port": 0, "workers": 3, "admission": {"max_in_flight_per_model": 2}}},
         "http.admission.max_in_flight_per_model is 2 but workers is 3"),
        ({"http": {"port": 0, "workers": 2, "worker_liveness_timeout_sec": 1}}, "worker_liveness_timeout_sec"),
        # HA on a wildcard host: every coordinator's election id and announced address "0.0.0.0:<port>"
        ({"server": {"host": "0.0.0.0"}, "ha": {"etcd_endpoints": ["127.0.0.1:2379"]}},
         "ha.advertise_address must be set when server.host is the wildcard '0.0.0.0'"),
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


async def test_http_limits_and_admission_sections_reach_the_co_located_front(tmp_path: Path) -> None:
    cfg = {"http": {"port": 0, "limits": {"max_model_chars": 8, "max_body_bytes": 2048},
                    "admission": {"max_buffered_bytes": 4096, "retry_after_sec": 7}}}
    async with start_coordinator(tmp_path, cfg) as c, aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{c.ports['http']}/v1/completions"
        async with http.post(url, json={"model": "m" * 9, "prompt": "x"}) as r:
            assert r.status == 400
            assert (await r.json())["error"]["code"] == "model_too_long"
        async with http.post(url, data=b"x" * 3000) as r:
            assert r.status == 413
        async with http.get(f"http://127.0.0.1:{c.ports['http']}/metrics") as r:
            assert "motor_gateway_admission_in_flight" in await r.text()
