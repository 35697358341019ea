"""The real ``motor-controller`` console script: ports file, auth, RPC errors, config errors."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import grpc
import pytest

from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as pbgrpc
from motor_common.grpc_client import call_metadata, open_channel
from motor_common.grpc_server import error_reason
from tests.conftest import tool
from tests.controller.fakes import KEY, FakeNodeManager
from tests.helpers import wait_for
from tests.procs import start_controller

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

CONFIG = {
    "heartbeat_interval_sec": 0.1,
    "heartbeat_timeout_sec": 0.6,
    "reconcile_interval_sec": 0.1,
    "fault_tolerance_config": {"enable_fault_tolerance": True},
}


async def test_console_script_serves_registry_heartbeats_admin_and_rejects_bad_calls(tmp_path: Path) -> None:
    async with start_controller(tmp_path, CONFIG, management_key=KEY) as proc:
        nm = await FakeNodeManager("solo-n0", "solo", 0, 1, proc.address).start()
        try:
            async with open_channel(proc.address) as ch:
                node = pbgrpc.ControllerServiceStub(ch)
                admin = pbgrpc.ControllerAdminServiceStub(ch)
                md = call_metadata(KEY)
                await wait_for(lambda: nm.starts, timeout=10, what="StartEngines")

                async def active() -> bool:
                    resp = await admin.ListInstances(pb.ListInstancesRequest(), metadata=md, timeout=2)
                    return [i.state for i in resp.instances] == [pb.INSTANCE_STATE_ACTIVE]

                await wait_for(active, timeout=10, what="instance ACTIVE")
                nodes = (await admin.ListNodes(pb.ListNodesRequest(job_name="solo"), metadata=md)).nodes
                assert [n.spec.node_id for n in nodes] == ["solo-n0"] and nodes[0].state == pb.NODE_STATE_RUNNING
                iid = nm.starts[0].instance_id
                ft = await admin.GetFaultToleranceStatus(pb.GetFaultToleranceStatusRequest(instance_id=iid), metadata=md)
                assert ft.state == pb.FAULT_TOLERANCE_STATE_IDLE

                # management key required on both services
                for call in (admin.ListNodes(pb.ListNodesRequest()), node.RegisterNode(pb.RegisterNodeRequest())):
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await call
                    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED

                # strict validation
                bad = nm.spec()
                bad.node_rank = 3
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await node.RegisterNode(pb.RegisterNodeRequest(node=bad), metadata=md, timeout=2)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "node_rank 3 must be < nodes_per_instance 1" in (err.value.details() or "")

                # same node id, other identity, while alive
                other = nm.spec()
                other.job_name = "other-job"
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await node.RegisterNode(pb.RegisterNodeRequest(node=other), metadata=md, timeout=2)
                assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
                assert error_reason(err.value) == "NODE_ID_CONFLICT"

                # identical re-register is idempotent and restarts nothing
                await node.RegisterNode(pb.RegisterNodeRequest(node=nm.spec()), metadata=md, timeout=2)

                # unknown node heartbeating → REREGISTER
                call = node.Heartbeat(iter([pb.HeartbeatRequest(node_id="ghost", sequence=7)]), metadata=md)
                acks = [a async for a in call]
                assert [(a.acked_sequence, a.command) for a in acks] == [(7, pb.HEARTBEAT_COMMAND_REREGISTER)]

                # a node reporting a fault of an instance it does not serve changes nothing
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await node.ReportFault(pb.ReportFaultRequest(
                        node_id="other-n0", instance_id=iid, level=pb.FAULT_LEVEL_ENGINE_DEAD), metadata=md)
                assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert error_reason(err.value) == "NODE_NOT_IN_INSTANCE"
                got = await admin.GetInstance(pb.GetInstanceRequest(instance_id=iid), metadata=md)
                assert got.instance.state == pb.INSTANCE_STATE_ACTIVE

                fault = await node.ReportFault(
                    pb.ReportFaultRequest(node_id="solo-n0", instance_id=iid, level=pb.FAULT_LEVEL_ENGINE_DEAD),
                    metadata=md,
                )
                assert fault.accepted and fault.relaunch_expected

                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await admin.GetInstance(pb.GetInstanceRequest(instance_id=12345), metadata=md)
                assert err.value.code() == grpc.StatusCode.NOT_FOUND
                await wait_for(active, timeout=5, what="still ACTIVE")
                assert len(nm.starts) == 1
        finally:
            await nm.close()


async def test_capability_mismatch_is_visible_and_nothing_is_started(tmp_path: Path) -> None:
    async with start_controller(tmp_path, CONFIG, management_key=KEY) as proc:
        nms = [await FakeNodeManager(f"cap-n{r}", "cap", r, 2, proc.address, fault_tolerance=r == 0).start()
               for r in range(2)]
        try:
            async with open_channel(proc.address) as ch:
                admin = pbgrpc.ControllerAdminServiceStub(ch)

                async def blocked() -> pb.ManagedInstance | None:
                    resp = await admin.ListInstances(pb.ListInstancesRequest(job_name="cap"), metadata=call_metadata(KEY))
                    return resp.instances[0] if resp.instances else None

                mi = await wait_for(blocked, timeout=10, what="fail-closed record")
                assert mi.state == pb.INSTANCE_STATE_INITIAL and "capabilities differ" in mi.reason
                got = await admin.GetInstance(pb.GetInstanceRequest(instance_id=mi.instance.id), metadata=call_metadata(KEY))
                assert "capabilities differ" in got.instance.reason
            assert all(not nm.starts for nm in nms)
        finally:
            for nm in nms:
                await nm.close()


def test_unknown_config_key_exits_2_naming_it(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("heartbeat_timeout_sec: 3\nfault_tolerance_config:\n  enable_engine_relunch: true\n")
    out = subprocess.run([tool("motor-controller"), "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert "fault_tolerance_config.enable_engine_relunch" in out.stderr and "enable_engine_relaunch" in out.stderr


def test_enable_dp_scale_up_is_rejected_not_silently_ignored(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("fault_tolerance_config:\n  enable_dp_scale_up: true\n")
    out = subprocess.run([tool("motor-controller"), "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "fault_tolerance_config.enable_dp_scale_up" in out.stderr


@pytest.mark.parametrize("where", ["a directory", "not a database", "under a file"])
def test_a_store_path_that_cannot_be_opened_exits_2_in_one_sentence(tmp_path: Path, where: str) -> None:
    """Exit 1 with a traceback before: `motor up` restarted such a controller forever instead of
    stopping with the reason (it does not restart a program that exits 2)."""
    (tmp_path / "garbage.db").write_bytes(b"not sqlite " * 100)
    (tmp_path / "file").write_text("")
    path, why = {"a directory": (tmp_path, "unable to open database file"),
                 "not a database": (tmp_path / "garbage.db", "file is not a database"),
                 "under a file": (tmp_path / "file" / "c.db", f"{tmp_path / 'file'}: File exists")}[where]  # fmt: skip
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"server: {{port: 0}}\nstore: {{path: '{path}'}}\n")
    out = subprocess.run([tool("motor-controller"), "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines()[-1] == f"error: store.path {path}: cannot open the controller's store: {why}"
    assert "Traceback" not in out.stderr



async def test_ops_endpoint_serves_metrics_health_and_readiness(tmp_path: Path) -> None:
    import json

    import aiohttp

    async with start_controller(tmp_path, {**CONFIG, "server": {"port": 0, "metrics_port": 0}},
                                management_key=KEY) as proc:
        ports = json.loads((tmp_path / "controller.ports.json").read_text())
        assert ports["metrics"], ports
        base = f"http://127.0.0.1:{ports['metrics']}"
        async with open_channel(proc.address) as ch:  # one RPC so a per-RPC series exists
            await pbgrpc.ControllerAdminServiceStub(ch).ListNodes(pb.ListNodesRequest(), metadata=call_metadata(KEY), timeout=5)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
                text = await r.text()
                assert r.status == 200 and 'method="ListNodes"' in text
            async with http.get(f"{base}/ready", timeout=aiohttp.ClientTimeout(total=5)) as r:
                assert r.status == 200 and (await r.json())["ready"] is True


@pytest.mark.parametrize(("value", "said"), [
    (b"2", "the store holds records in format 2, written by a newer Motor"),
    (b"", "store record 'meta/format' cannot be decoded"),
])
def test_a_store_it_cannot_act_on_exits_2_in_one_sentence_not_a_traceback(tmp_path: Path, value: bytes,
                                                                         said: str) -> None:
    """A store in a newer format (a downgrade) or a damaged record a restart cannot mend: exit 2
    (`motor up` does not restart a program that exits 2) and one line naming the store file."""
    db = tmp_path / "controller.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE kv (key TEXT PRIMARY KEY, value BLOB NOT NULL)")
        conn.execute("INSERT INTO kv VALUES ('meta/format', ?)", (value,))
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"server": {"port": 0}, "store": {"path": str(db)}}))
    out = subprocess.run([tool("motor-controller"), "--config", str(cfg)], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2, out.stderr
    assert f"error: store {db}: {said}" in out.stderr and "Traceback" not in out.stderr
    with sqlite3.connect(db) as conn:  # nothing written: no epoch, the format left as found
        assert conn.execute("SELECT key, value FROM kv").fetchall() == [("meta/format", value)]
