"""The motor-gateway process: strict config, ports file, graceful stop."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import orjson
import pytest

from tests.conftest import tool
from tests.helpers import wait_for


def test_unknown_config_key_exits_2_naming_it(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text("port: 0\ncoordinater: ['127.0.0.1:1']\n")
    out = subprocess.run([tool("motor-gateway"), "--config", str(cfg)], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 2
    assert "coordinater" in out.stderr
    assert "coordinators" in out.stderr  # the did-you-mean hint


@pytest.mark.parametrize(("yaml", "needle"), [
    ("limits: {max_connections: 0}\n", "max_connections"),
    ("limits: {max_body_bytes: 10}\n", "max_body_bytes"),
    ("admission: {max_queued_per_model: -1}\n", "max_queued_per_model"),
    ("admission: {max_inflight_per_model: 3}\n", "max_inflight_per_model"),
    ("workers: 0\n", "workers"),
    ("workers: 257\n", "workers"),
    ("worker_liveness_timeout_sec: 1\n", "worker_liveness_timeout_sec"),
    # the front's in-flight limit split over 3 workers would leave one a share of 0 (= unbounded)
    ("workers: 3\nadmission: {max_in_flight_per_key: 2}\n",
     "admission.max_in_flight_per_key is 2 but workers is 3"),
])
def test_bad_limits_or_admission_exit_2_naming_the_key(tmp_path: Path, yaml: str, needle: str) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text("port: 0\n" + yaml)
    out = subprocess.run([tool("motor-gateway"), "--config", str(cfg)], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 2, out.stderr
    assert needle in out.stderr


@pytest.mark.slow
async def test_ports_file_and_graceful_sigterm(tmp_path: Path) -> None:
    ports = tmp_path / "gw.ports"
    proc = await asyncio.create_subprocess_exec(
        tool("motor-gateway"), "--port", "0", "--coordinator", "127.0.0.1:1", "--ports-file", str(ports),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        await wait_for(ports.exists, timeout=20, what="ports file")
        port = orjson.loads(ports.read_bytes())["http"]
        assert isinstance(port, int) and port > 0
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_stop_lets_in_flight_requests_finish(tmp_path: Path) -> None:
    import aiohttp

    from motor_gateway.config import GatewayConfig
    from motor_gateway.main import serve
    from tests.gateway.fakes import chunk, fake_coordinator, head

    gate = asyncio.Event()

    async def slow(request: object, context: object) -> object:
        yield head(200, "text/event-stream")
        yield chunk(b"data: 1\n\n")
        await gate.wait()
        yield chunk(b"data: [DONE]\n\n")

    ports = tmp_path / "gw.ports"
    async with fake_coordinator() as (addr, fake):
        fake.script = slow  # type: ignore[assignment]
        stop = asyncio.Event()
        task = asyncio.create_task(serve(GatewayConfig(port=0, coordinators=(addr,)), str(ports), stop=stop))
        await wait_for(ports.exists, timeout=10, what="ports file")
        port = orjson.loads(ports.read_bytes())["http"]
        async with aiohttp.ClientSession() as http:
            resp = await http.post(f"http://127.0.0.1:{port}/v1/completions",
                                   json={"model": "m", "prompt": "p", "stream": True})
            assert await resp.content.readuntil(b"\n\n") == b"data: 1\n\n"
            stop.set()  # as SIGTERM does

            async def refusing() -> bool:
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                except OSError:
                    return True
                writer.close()
                return False

            await wait_for(refusing, timeout=10, what="gateway to stop accepting")
            gate.set()
            assert await asyncio.wait_for(resp.read(), 10) == b"data: [DONE]\n\n"
        assert await asyncio.wait_for(task, 15) == 0
