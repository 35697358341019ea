"""The Kubernetes node restarter with the real ``kubernetes`` client against a local HTTP server
that speaks the pods API (``DELETE /api/v1/namespaces/NS/pods/NAME``: 200 with the Pod, 404 and
403 with a ``Status`` body, 401 without the right bearer token). No Kubernetes cluster runs here:
this server stands in for the API server, nothing else is faked.

Covers both credential paths (kubeconfig out of cluster; ServiceAccount token + CA in cluster, over
TLS with a certificate made at test time) and the start-up failure of ``motor-controller``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from motor_common.errors import ConfigError, Unavailable
from motor_controller.config import NodeRestartConfig
from motor_controller.node_restarter import (
    KubernetesNodeRestarter,
    build_restarter,
    kubernetes_pod_api,
    valid_pod_name,
)
from tests.controller.factories import spec
from tests.k8s_api import DENIED, TOKEN, FakeApiServer, serve, write_kubeconfig


@pytest.fixture
async def apiserver() -> AsyncIterator[FakeApiServer]:
    async with serve(FakeApiServer(pods={("motor", "prefill-0"), ("motor", "decode-0")})) as api:
        yield api


def kube_cfg(path: Path, namespace: str = "motor") -> NodeRestartConfig:
    return NodeRestartConfig(backend="kubernetes", namespace=namespace, kubeconfig=str(path), api_timeout_sec=5)


async def test_kubeconfig_client_deletes_the_pod_named_after_the_node(apiserver: FakeApiServer, tmp_path: Path) -> None:
    restarter = build_restarter(kube_cfg(write_kubeconfig(tmp_path / "kc", apiserver.url)), None, environ={})  # type: ignore[arg-type]
    assert restarter.name == "kubernetes"
    await restarter.restart(spec(0, node_id="prefill-0"), "partial loss")
    assert apiserver.pods == {("motor", "decode-0")}
    assert apiserver.requests == [("DELETE", "/api/v1/namespaces/motor/pods/prefill-0", f"Bearer {TOKEN}")]


async def test_a_pod_already_gone_counts_as_restarted(apiserver: FakeApiServer, tmp_path: Path) -> None:
    restarter = build_restarter(kube_cfg(write_kubeconfig(tmp_path / "kc", apiserver.url)), None, environ={})  # type: ignore[arg-type]
    await restarter.restart(spec(0, node_id="gone-0"), "x")  # 404: no error
    assert apiserver.requests[-1][:2] == ("DELETE", "/api/v1/namespaces/motor/pods/gone-0")
    assert len(apiserver.pods) == 2


async def test_403_keeps_the_api_servers_message(apiserver: FakeApiServer, tmp_path: Path) -> None:
    restarter = build_restarter(kube_cfg(write_kubeconfig(tmp_path / "kc", apiserver.url), "forbidden"), None, environ={})  # type: ignore[arg-type]
    with pytest.raises(Unavailable) as info:
        await restarter.restart(spec(0, node_id="prefill-0"), "x")
    assert info.value.reason == "POD_DELETE_FAILED"
    msg = info.value.message
    assert msg.startswith("deleting pod forbidden/prefill-0 failed: 403 Forbidden: ")
    assert DENIED.format(name="prefill-0", ns="forbidden") in msg


async def test_a_wrong_token_is_reported_as_401(apiserver: FakeApiServer, tmp_path: Path) -> None:
    restarter = build_restarter(kube_cfg(write_kubeconfig(tmp_path / "kc", apiserver.url, token="stale")), None, environ={})  # type: ignore[arg-type]
    with pytest.raises(Unavailable, match="401 Unauthorized"):
        await restarter.restart(spec(0, node_id="prefill-0"), "x")
    assert len(apiserver.pods) == 2


async def test_an_unreachable_api_server_is_unavailable_within_the_timeout(tmp_path: Path) -> None:
    from tests.helpers import free_port

    kc = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{free_port()}")
    restarter = build_restarter(kube_cfg(kc), None, environ={})  # type: ignore[arg-type]
    with pytest.raises(Unavailable, match=r"deleting pod motor/prefill-0 failed: .*Error"):
        await asyncio.wait_for(restarter.restart(spec(0, node_id="prefill-0"), "x"), timeout=30)


async def test_a_node_id_that_is_no_pod_name_is_refused_without_calling_the_api(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    restarter = build_restarter(kube_cfg(write_kubeconfig(tmp_path / "kc", apiserver.url)), None, environ={})  # type: ignore[arg-type]
    with pytest.raises(Unavailable, match="is not a pod name"):
        await restarter.restart(spec(0, node_id="host-a:motor:0"), "x")
    assert apiserver.requests == []
    assert valid_pod_name("motor-vllm-decode-0") and valid_pod_name("a.b-1")
    assert not valid_pod_name("host:job:0") and not valid_pod_name("Upper") and not valid_pod_name("x" * 254)


def _make_cert(tmp_path: Path) -> tuple[Path, Path]:
    key, cert = tmp_path / "tls.key", tmp_path / "tls.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=kubernetes",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return key, cert


async def test_in_cluster_uses_the_service_account_token_and_ca_over_tls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ssl

    from kubernetes.config import incluster_config

    key, cert = _make_cert(tmp_path)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    # the ServiceAccount mount is a fixed path in a pod; point the client's loader at ours
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(cert))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    async with serve(FakeApiServer(pods={("motor", "decode-0")}), ssl_context=ctx) as api:
        port = api.url.rsplit(":", 1)[1]
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}
        restarter = KubernetesNodeRestarter(kubernetes_pod_api("", env), "motor", timeout=5)
        await restarter.restart(spec(0, node_id="decode-0"), "x")
        assert api.pods == set()
        assert api.requests == [("DELETE", "/api/v1/namespaces/motor/pods/decode-0", f"Bearer {TOKEN}")]


def test_no_credentials_is_a_config_error_naming_the_problem(tmp_path: Path) -> None:
    cfg = NodeRestartConfig(backend="kubernetes", namespace="motor")
    with pytest.raises(ConfigError, match=r"not in a cluster .*kubeconfig /nonexistent is unusable"):
        build_restarter(cfg, None, environ={"KUBECONFIG": "/nonexistent"})  # type: ignore[arg-type]
    bad = tmp_path / "bad"
    bad.write_text("this: [is not a kubeconfig")
    with pytest.raises(ConfigError, match=r"kubeconfig .*bad is unusable"):
        build_restarter(NodeRestartConfig(backend="kubernetes", kubeconfig=str(bad)), None, environ={})  # type: ignore[arg-type]
    # in a cluster without a mounted token
    with pytest.raises(ConfigError, match="in-cluster credentials unusable"):
        build_restarter(cfg, None, environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"})  # type: ignore[arg-type]


def test_motor_controller_with_the_kubernetes_backend_and_no_credentials_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "controller.yaml"
    cfg.write_text(f"""server: {{host: 127.0.0.1, port: 0}}
store: {{path: {tmp_path / 'state.db'}}}
node_restart: {{backend: kubernetes, namespace: motor}}
""")
    env = {"PATH": "/usr/bin:/bin", "KUBECONFIG": "/nonexistent", "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "motor_controller.main", "--config", str(cfg)],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "node_restart.backend is kubernetes" in proc.stderr and "/nonexistent" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "state.db").exists()  # failed before opening the store
