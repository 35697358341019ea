"""The PreStop hook of an engine pod (``python -m motor_nodemanager.prestop``) against the real
motor-nodemanager process, started the way the Kubernetes manifests start it (node id from
POD_NAME, config file from the same path)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from motor_common.gen.motor.controller.v1 import controller_pb2 as cpb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as pb
from motor_common.grpc_server import GrpcServer
from tests.helpers import free_port, wait_for
from tests.nodemanager.conftest import Admin, nm_config
from tests.nodemanager.fake_controller import FakeController
from tests.nodemanager.test_nodemanager_process import all_normal, registered, start_request
from tests.procs import start_nodemanager

pytestmark = pytest.mark.timeout(60)


def prestop(config: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "motor_nodemanager.prestop", "--config", str(config), *args],
                          capture_output=True, text=True, timeout=30, env=env)  # fmt: skip


async def test_prestop_pauses_the_node_it_runs_beside(
    tmp_path: Path, controller: tuple[GrpcServer, FakeController], key_file: str
) -> None:
    server, impl = controller
    port = free_port()
    cfg = nm_config(server.port, key_file, tmp_path, server={"port": port})
    nm = await start_nodemanager(tmp_path, cfg, env={"POD_NAME": "motor-vllm-decode-0"})
    admin = Admin(nm.address)
    try:
        spec = await registered(impl)
        assert spec.node_id == "motor-vllm-decode-0"  # node id = pod name
        await admin.call("StartEngines", start_request(spec))
        await wait_for(lambda: all_normal(admin), timeout=20, what="engines NORMAL")
        assert (await admin.call("GetReadiness", pb.GetReadinessRequest())).ready

        # a wrong key: exit 1 with the reason, nothing paused
        bad_key = tmp_path / "bad.key"
        bad_key.write_text("wrong\n")
        bad_cfg = tmp_path / "bad.yaml"
        bad_cfg.write_text(yaml.safe_dump({**cfg, "server": {**cfg["server"], "management_key_file": str(bad_key)}}))
        out = prestop(bad_cfg, "--drain-sec", "0")
        assert out.returncode == 1 and "PauseNode on 127.0.0.1:" in out.stderr and "UNAUTHENTICATED" in out.stderr
        assert (await admin.call("GetStatus", pb.GetStatusRequest())).state != cpb.NODE_STATE_PAUSED

        out = prestop(nm.config_path, "--drain-sec", "0")
        assert out.returncode == 0, out.stderr
        assert "node paused" in out.stderr
        assert (await admin.call("GetStatus", pb.GetStatusRequest())).state == cpb.NODE_STATE_PAUSED
        ready = await admin.call("GetReadiness", pb.GetReadinessRequest())
        assert not ready.ready
    finally:
        await admin.close()
        assert nm.terminate() == 0


async def test_prestop_with_separate_keys_uses_the_operator_key_it_is_given(
    tmp_path: Path, controller: tuple[GrpcServer, FakeController], key_file: str
) -> None:
    """A fleet with separate keys has no management_key_file: the nodemanager presents a node key
    to the controller and accepts operator keys only, so the hook needs --key-file."""
    server, impl = controller
    operators, prestop_key, node_key = tmp_path / "operators.keys", tmp_path / "prestop.key", tmp_path / "node.key"
    operators.write_text("prestop: prestop-operator-key\n")
    prestop_key.write_text("prestop-operator-key\n")
    node_key.write_text(Path(key_file).read_text())  # what the (fake) controller accepts from nodes
    cfg = nm_config(server.port, key_file, tmp_path, server={"port": free_port()})
    cfg["server"].pop("management_key_file")
    cfg["server"]["auth"] = {"operator_keys_file": str(operators), "key_file": str(node_key)}
    nm = await start_nodemanager(tmp_path, cfg)
    admin = Admin(nm.address, key="prestop-operator-key")
    try:
        spec = await registered(impl)  # registered with its node key
        await admin.call("StartEngines", start_request(spec))
        await wait_for(lambda: all_normal(admin), timeout=20, what="engines NORMAL")
        out = prestop(nm.config_path, "--drain-sec", "0")
        assert out.returncode == 2 and "pass --key-file with one of its operator keys" in out.stderr
        out = prestop(nm.config_path, "--drain-sec", "0", "--key-file", str(node_key))  # a node key: refused
        assert out.returncode == 1 and "UNAUTHENTICATED" in out.stderr
        assert (await admin.call("GetStatus", pb.GetStatusRequest())).state != cpb.NODE_STATE_PAUSED
        out = prestop(nm.config_path, "--drain-sec", "0", "--key-file", str(prestop_key))
        assert out.returncode == 0, out.stderr
        assert (await admin.call("GetStatus", pb.GetStatusRequest())).state == cpb.NODE_STATE_PAUSED
    finally:
        await admin.close()
        assert nm.terminate() == 0


def test_prestop_with_a_bad_config_or_arguments_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "nm.yaml"
    cfg.write_text("role: decode\nserver: {management_key_file: /nonexistent/key}\n")
    out = prestop(cfg, "--drain-sec", "0")
    assert out.returncode == 2 and "cannot read operator key file /nonexistent/key" in out.stderr
    out = prestop(cfg, "--drain-sec", "-1")
    assert out.returncode == 2 and "--drain-sec must be in [0, 3600]" in out.stderr


async def test_prestop_speaks_mutual_tls_with_the_nodes_own_identity(tmp_path: Path, key_file: str) -> None:
    from motor_common import certs
    from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as cgrpc
    from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2_grpc as pbgrpc
    from motor_common.grpc_client import call_metadata, open_channel
    from motor_common.grpc_server import ServerConfig
    from motor_common.tls import TlsConfig
    from tests.nodemanager.conftest import KEY
    from tests.nodemanager.fake_controller import SERVICE

    ca = certs.make_ca(tmp_path / "ca")
    ctl_id = certs.issue(ca, tmp_path / "ca", "controller")
    nm_id = certs.issue(ca, tmp_path / "ca", "nodemanager")

    def tls(issued: certs.Issued) -> TlsConfig:
        return TlsConfig(cert_file=str(issued.cert_file), key_file=str(issued.key_file),
                         ca_file=str(ca.cert_file), require_client_cert=True)  # fmt: skip

    impl = FakeController()
    ctl = GrpcServer("fake-controller", ServerConfig(port=0, grace_seconds=0.1, tls=tls(ctl_id)), management_key=KEY)
    ctl.add_service(SERVICE, lambda s: cgrpc.add_ControllerServiceServicer_to_server(impl, s), protected=True)
    await ctl.start()
    nm_tls = {"cert_file": str(nm_id.cert_file), "key_file": str(nm_id.key_file), "ca_file": str(ca.cert_file),
              "require_client_cert": True}  # fmt: skip
    cfg = nm_config(ctl.port, key_file, tmp_path, server={"port": free_port(), "tls": nm_tls})
    nm = await start_nodemanager(tmp_path, cfg)
    try:
        await registered(impl)  # the node reached the controller over mutual TLS
        # without the node's identity the pause cannot even connect: nothing changes
        plain = tmp_path / "plain.yaml"
        plain.write_text(yaml.safe_dump({**cfg, "server": {**cfg["server"], "tls": {}}}))
        out = prestop(plain, "--drain-sec", "0")
        assert out.returncode == 1 and "UNAVAILABLE" in out.stderr

        out = prestop(nm.config_path, "--drain-sec", "0")
        assert out.returncode == 0, out.stderr
        async with open_channel(nm.address, tls=tls(ctl_id)) as ch:
            ready = await pbgrpc.NodeManagerServiceStub(ch).GetReadiness(
                pb.GetReadinessRequest(), metadata=call_metadata(KEY), timeout=5
            )
        assert (ready.ready, ready.reason) == (False, "paused")
    finally:
        assert nm.terminate() == 0
        await ctl.stop(0)
