"""The nodemanager's HTTP ops endpoint: /metrics, /health and /ready (readiness = the node's)."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from motor_common.grpc_server import GrpcServer
from tests.nodemanager.conftest import nm_config
from tests.nodemanager.fake_controller import FakeController
from tests.procs import start_nodemanager

pytestmark = pytest.mark.slow


async def test_ops_endpoint_reports_not_ready_before_a_start_command(
    tmp_path: Path, controller: tuple[GrpcServer, FakeController], key_file: str
) -> None:
    server, _ = controller
    cfg = nm_config(server.port, key_file, tmp_path)
    cfg["server"] = {**cfg["server"], "metrics_port": 0}
    nm = await start_nodemanager(tmp_path, cfg)
    try:
        ports = json.loads((tmp_path / "nm.ports.json").read_text())
        base = f"http://127.0.0.1:{ports['metrics']}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            async with http.get(f"{base}/health") as r:
                assert r.status == 200
            async with http.get(f"{base}/ready") as r:
                body = await r.json()
                assert r.status == 503 and body["ready"] is False and body["reason"]
            async with http.get(f"{base}/metrics") as r:
                assert r.status == 200 and "motor_grpc_server_handled_total" in await r.text()
    finally:
        nm.terminate()
