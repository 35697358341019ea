"""``stop`` typed on stdin stops the nodemanager: modules in reverse start order, engines last, exit 0.
A closed stdin (EOF) is not a stop request."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as pb
from motor_common.grpc_server import GrpcServer
from tests.conftest import tool
from tests.helpers import kill_group, wait_for
from tests.nodemanager.conftest import Admin, nm_config
from tests.nodemanager.fake_controller import FakeController
from tests.nodemanager.test_nodemanager_process import all_normal, gone, registered, start_request

Ctl = tuple[GrpcServer, FakeController]


async def spawn_with_stdin_pipe(tmp_path: Path, cfg: dict[str, object]) -> tuple[subprocess.Popen[bytes], int, Path]:
    cfg_path = tmp_path / "nm.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    ports = tmp_path / "nm.ports.json"
    log_path = tmp_path / "nm.log"
    env = {k: v for k, v in os.environ.items() if k not in ("USER_CONFIG_PATH", "CONFIG_PATH")}
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            [tool("motor-nodemanager"), "--config", str(cfg_path), "--ports-file", str(ports)],
            stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    await wait_for(lambda: ports.exists() or proc.poll() is not None, timeout=20, what="ports file")
    assert proc.poll() is None, log_path.read_text()
    return proc, int(json.loads(ports.read_text())["grpc"]), log_path


@pytest.mark.slow
async def test_stop_on_a_stdin_pipe_stops_modules_in_reverse_order_and_the_engines(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    server, impl = controller
    proc, port, log_path = await spawn_with_stdin_pipe(tmp_path, nm_config(server.port, key_file, tmp_path))
    admin = Admin(f"127.0.0.1:{port}")
    try:
        spec = await registered(impl)
        pids = list((await admin.call("StartEngines", start_request(spec))).pids)
        await wait_for(lambda: all_normal(admin), timeout=15, what="engines NORMAL")
        assert proc.stdin is not None
        proc.stdin.write(b"status\nst")  # other words and a split line are not a stop
        proc.stdin.flush()
        proc.stdin.write(b"op\n")
        proc.stdin.flush()
        await wait_for(lambda: proc.poll() is not None, timeout=15, what="exit after 'stop'")
        assert proc.returncode == 0
        text = log_path.read_text()
        assert "'stop' on stdin" in text
        stops = [line.split("stopping module ", 1)[1].split()[0].strip('"') for line in text.splitlines()
                 if "stopping module " in line]  # fmt: skip
        assert stops == ["config-watcher", "heartbeat", "registration", "api-server", "engines"]
        assert all(gone(p) for p in pids)
    finally:
        await admin.close()
        if proc.poll() is None:
            kill_group(proc.pid)
            proc.wait(5)


async def test_a_closed_stdin_is_not_a_stop_request(tmp_path: Path, controller: Ctl, key_file: str) -> None:
    server, impl = controller
    proc, port, _ = await spawn_with_stdin_pipe(tmp_path, nm_config(server.port, key_file, tmp_path))
    admin = Admin(f"127.0.0.1:{port}")
    try:
        await registered(impl)
        assert proc.stdin is not None
        proc.stdin.close()  # EOF
        n = len(impl.frames)
        await wait_for(lambda: len(impl.frames) >= n + 3, timeout=10, what="heartbeats after EOF")
        assert proc.poll() is None
        st = await admin.call("GetStatus", pb.GetStatusRequest())
        assert st.registered
    finally:
        await admin.close()
        proc.terminate()
        assert proc.wait(15) == 0
