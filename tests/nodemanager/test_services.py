"""The service registry (engine, KV-cache store worker): which services a node runs, and an engine
relaunch that leaves the KV store alone.

The KV store worker here is a tiny stand-in (``python -m http.server`` on a free port), not Mooncake:
the nodemanager only launches, health-checks (alive + port accepting) and stops it."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest

from motor_common.errors import ConfigError
from motor_common.gen.motor.controller.v1 import controller_pb2 as cpb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as pb
from motor_common.grpc_server import GrpcServer
from motor_nodemanager import config as nmconfig
from motor_nodemanager.config import KvCacheStoreConfig
from motor_nodemanager.services import ENGINE, KV_CACHE_STORE, plan_services
from tests.helpers import free_port, wait_for
from tests.nodemanager.conftest import Admin, nm_config
from tests.nodemanager.fake_controller import FakeController
from tests.nodemanager.test_nodemanager_process import all_normal, gone, registered, start_request
from tests.procs import start_nodemanager

Ctl = tuple[GrpcServer, FakeController]
CMD = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1"]


def test_services_follow_the_kv_cache_store_mode() -> None:
    assert plan_services(KvCacheStoreConfig()) == (ENGINE,)
    assert plan_services(KvCacheStoreConfig(enable=True, command=["x"])) == (KV_CACHE_STORE, ENGINE)
    assert plan_services(KvCacheStoreConfig(enable=True, command=["x"], mode="separated")) == (KV_CACHE_STORE,)


def test_an_enabled_kv_store_needs_a_command(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("role: prefill\nkv_cache_store_config: {enable: true}\n")
    with pytest.raises(ConfigError, match=r"kv_cache_store_config\.command"):
        nmconfig.load(str(p), environ={})


def kv_pid(nm_pid: int) -> int:
    for c in psutil.Process(nm_pid).children(recursive=True):
        if "http.server" in " ".join(c.cmdline()):
            return int(c.pid)
    return 0


@pytest.mark.slow
async def test_engine_relaunch_restarts_only_the_engines_not_the_kv_store(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    server, impl = controller
    port = free_port()
    kv = {"enable": True, "mode": "combined", "command": [*CMD, str(port)], "port": port}
    nm = await start_nodemanager(tmp_path, nm_config(server.port, key_file, tmp_path, kv_cache_store_config=kv))
    admin = Admin(nm.address)
    try:
        spec = await registered(impl)
        store = await wait_for(lambda: kv_pid(nm.proc.pid), timeout=5, what="KV store process")
        pids = list((await admin.call("StartEngines", start_request(spec))).pids)
        await wait_for(lambda: all_normal(admin), timeout=15, what="engines NORMAL")
        ready = await admin.call("GetReadiness", pb.GetReadinessRequest())
        assert ready.ready, ready.reason
        assert psutil.Process(pids[0]).environ()["MOTOR_KV_STORE_ADDRESS"] == f"127.0.0.1:{port}"

        resp = await admin.call("RestartEngine", pb.RestartEngineRequest(action=pb.RESTART_ACTION_RESTART))
        assert set(resp.pids).isdisjoint(pids) and all(gone(p) for p in pids)
        assert kv_pid(nm.proc.pid) == store  # the KV store kept its process
        assert "KV cache store stopped" not in nm.log_text()
    finally:
        await admin.close()
        assert nm.terminate() == 0
    assert gone(store)


async def test_a_kv_store_only_node_neither_registers_nor_heartbeats_and_is_ready_with_its_store(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    server, impl = controller
    port = free_port()
    kv = {"enable": True, "mode": "separated", "command": [*CMD, str(port)], "port": port}
    nm = await start_nodemanager(tmp_path, nm_config(server.port, key_file, tmp_path, kv_cache_store_config=kv))
    admin = Admin(nm.address)
    try:

        async def ready() -> bool:
            r = await admin.call("GetReadiness", pb.GetReadinessRequest())
            return bool(r.ready)

        await wait_for(ready, timeout=10, what="KV store ready")
        r = await admin.call("GetReadiness", pb.GetReadinessRequest())
        assert "KV-store-only" in r.reason
        st = await admin.call("GetStatus", pb.GetStatusRequest())
        assert not st.registered and st.state == cpb.NODE_STATE_UNSPECIFIED
        assert not impl.registrations and not impl.frames
        store = kv_pid(nm.proc.pid)
        assert store
    finally:
        await admin.close()
        assert nm.terminate() == 0
    assert gone(store)
