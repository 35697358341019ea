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
