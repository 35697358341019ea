"""deploy/kustomize: every overlay renders with ``kubectl kustomize``, every object validates against
the Kubernetes OpenAPI schemas (``kubernetes-validate``, schemas bundled, strict), and our own rules
hold: distinct liveness/readiness probes, resource requests, non-root + read-only root filesystem,
downward-API identity, RBAC = exactly what the code calls, Services and probes pointing at real
ports, and every program's config (file + environment) accepted by Motor's own strict loaders.

No Kubernetes API server runs here: these are static checks of what ``kubectl apply -k`` would send.
"""

from __future__ import annotations

import ast
import base64
import os
import re
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.conftest import tool

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "deploy" / "kustomize"
OVERLAYS = ["standalone", "managed", "managed-vllm", "managed-sglang", "dev"]
TOP = ["standalone", "managed-vllm", "managed-sglang", "dev"]  # what a user applies (namespace set)
K8S_VERSION = "1.37.0"  # the newest schemas bundled with the pinned kubernetes-validate
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}
# The Secrets deploy/kustomize/make-secrets.sh makes (docs/kubernetes.md, "Keys").
SECRETS = {"motor-management-key", "motor-node-keys", "motor-node-credentials"}
# The only Kubernetes API call Motor makes, and the RBAC rule it needs: (apiGroup, resource, verb).
API_CALLS = {"delete_namespaced_pod": ("", "pods", "delete")}


@cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    out = subprocess.run([tool("kubectl"), "kustomize", str(KUSTOMIZE / overlay)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, f"kubectl kustomize {overlay} failed:\n{out.stderr}"
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def objects(overlay: str, kind: str | None = None) -> list[dict[str, Any]]:
    return [o for o in render(overlay) if kind is None or o["kind"] == kind]


def named(overlay: str, kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects(overlay, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{overlay}: {kind}/{name} x{len(found)}"
    return found[0]


def pod_templates(overlay: str) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for o in render(overlay):
        if o["kind"] in WORKLOADS:
            yield o, o["spec"]["template"]


def containers(overlay: str) -> Iterator[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    for w, t in pod_templates(overlay):
        for c in t["spec"]["containers"]:
            yield w, t, c


def ident(w: dict[str, Any], c: dict[str, Any]) -> str:
    return f"{w['kind']}/{w['metadata']['name']}:{c['name']}"


def config_map(overlay: str, prefix: str) -> dict[str, Any]:
    found = [o for o in objects(overlay, "ConfigMap") if o["metadata"]["name"].startswith(prefix)]
    assert len(found) == 1, f"{overlay}: ConfigMap {prefix}* x{len(found)}"
    return found[0]


# --- rendering and schemas ------------------------------------------------------------------------
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_every_object_is_valid_against_the_openapi_schema(overlay: str) -> None:
    objs = render(overlay)
    assert objs
    for o in objs:
        kubernetes_validate.validate(o, K8S_VERSION, strict=True)  # raises ValidationError


def test_the_schema_check_catches_a_wrong_field() -> None:
    bad = dict(objects("standalone", "Service")[0])
    bad["spec"] = {**bad["spec"], "selectr": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", TOP)
def test_top_overlays_set_a_namespace_and_reference_only_objects_they_define(overlay: str) -> None:
    for o in render(overlay):
        if o["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert o["metadata"].get("namespace") == "motor", f"{o['kind']}/{o['metadata']['name']}"
    cms = {o["metadata"]["name"] for o in objects(overlay, "ConfigMap")}
    sas = {o["metadata"]["name"] for o in objects(overlay, "ServiceAccount")}
    for w, t in pod_templates(overlay):
        assert t["spec"]["serviceAccountName"] in sas
        for v in t["spec"].get("volumes", []):
            if "configMap" in v:
                assert v["configMap"]["name"] in cms, f"{w['metadata']['name']}: {v}"
            if "secret" in v:  # created by the user before applying (deploy/kustomize/make-secrets.sh)
                assert v["secret"]["secretName"] in SECRETS
        for c in t["spec"]["containers"]:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("configMapKeyRef")
                if ref:
                    assert ref["name"] in cms and ref["key"] in named(overlay, "ConfigMap", ref["name"])["data"]


# --- our rules ------------------------------------------------------------------------------------
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_distinct_liveness_and_readiness_probes_on_declared_ports(overlay: str) -> None:
    for w, _, c in containers(overlay):
        live, ready = c.get("livenessProbe"), c.get("readinessProbe")
        assert live and ready, f"{ident(w, c)}: liveness and readiness probes required"
        strip = lambda p: {k: v for k, v in p.items() if k in ("httpGet", "grpc", "tcpSocket", "exec")}  # noqa: E731
        assert strip(live) != strip(ready), f"{ident(w, c)}: liveness and readiness must be different checks"
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        for probe in (live, ready):
            action = probe.get("httpGet") or probe.get("grpc") or probe.get("tcpSocket")
            assert action is not None, f"{ident(w, c)}: probe without an action"
            port = action["port"]
            assert port in ports or port in ports.values(), f"{ident(w, c)}: probe port {port} not declared"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_requests_resources_and_runs_non_root_read_only(overlay: str) -> None:
    for w, t, c in containers(overlay):
        req = c.get("resources", {}).get("requests", {})
        assert "cpu" in req and "memory" in req, f"{ident(w, c)}: cpu and memory requests required"
        assert "memory" in c["resources"].get("limits", {}), f"{ident(w, c)}: memory limit required"
        pod_sc, sc = t["spec"].get("securityContext", {}), c.get("securityContext", {})
        assert pod_sc.get("runAsNonRoot") is True and (sc.get("runAsUser") or pod_sc.get("runAsUser", 0)) != 0
        assert pod_sc.get("seccompProfile", {}).get("type") == "RuntimeDefault"
        assert sc.get("allowPrivilegeEscalation") is False, ident(w, c)
        assert sc.get("readOnlyRootFilesystem") is True, ident(w, c)
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], ident(w, c)
        mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
        if c["image"].startswith("motor"):
            assert "/tmp" in mounts, f"{ident(w, c)}: a writable /tmp is needed with a read-only root"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_image_has_an_explicit_tag_or_digest(overlay: str) -> None:
    # no tag means :latest with imagePullPolicy Always: not the version the docs build and push
    for w, t in pod_templates(overlay):
        for c in (*t["spec"]["containers"], *t["spec"].get("initContainers", [])):
            name, _, digest = c["image"].partition("@")
            tag = name.rpartition("/")[2].partition(":")[2]
            assert digest or (tag and tag != "latest"), f"{ident(w, c)}: image {c['image']!r} has no explicit tag"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_replicated_motor_workloads_prefer_distinct_kubernetes_nodes(overlay: str) -> None:
    for w, t in pod_templates(overlay):
        labels = t["metadata"].get("labels", {})
        if labels.get("app.kubernetes.io/name") != "motor" or w["spec"].get("replicas", 1) < 2:
            continue
        terms = (t["spec"].get("affinity", {}).get("podAntiAffinity", {})
                 .get("preferredDuringSchedulingIgnoredDuringExecution", []))  # fmt: skip
        assert any(
            term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
            and term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()
            and term["podAffinityTerm"]["labelSelector"]["matchLabels"].get("app.kubernetes.io/component")
            == labels.get("app.kubernetes.io/component")
            for term in terms
        ), f"{w['kind']}/{w['metadata']['name']}: no preferred anti-affinity on kubernetes.io/hostname"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_motor_containers_get_their_identity_from_the_downward_api(overlay: str) -> None:
    want = {"POD_NAME": "metadata.name", "POD_IP": "status.podIP", "POD_NAMESPACE": "metadata.namespace"}
    for w, _, c in containers(overlay):
        if not c["image"].startswith("motor"):
            continue
        env = {e["name"]: e for e in c.get("env", [])}
        for name, path in want.items():
            assert env[name]["valueFrom"]["fieldRef"]["fieldPath"] == path, f"{ident(w, c)}: {name}"
        defined: set[str] = set()
        for e in c.get("env", []):  # $(VAR) only expands when VAR is defined earlier in the list
            for ref in re.findall(r"\$\(([A-Z_]+)\)", str(e.get("value", ""))):
                assert ref in defined, f"{ident(w, c)}: {e['name']} uses $({ref}) before it is defined"
            defined.add(e["name"])


def _code_api_calls() -> set[str]:
    """Kubernetes client methods called anywhere in Motor's sources."""
    calls: set[str] = set()
    for path in [*ROOT.glob("services/*/motor_*/**/*.py"), *ROOT.glob("common/motor_common/*.py"),
                 *ROOT.glob("gateway/motor_gateway/*.py"), *ROOT.glob("cli/motor_cli/*.py")]:  # fmt: skip
        text = path.read_text()
        if "kubernetes" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Attribute) and re.fullmatch(r"(create|delete|patch|replace|list|read|watch)_\w+", node.attr):
                calls.add(node.attr)
    return calls


def test_the_code_calls_only_the_api_methods_the_rbac_rules_cover() -> None:
    assert _code_api_calls() == set(API_CALLS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rbac_grants_each_service_account_exactly_what_the_code_calls(overlay: str) -> None:
    assert not objects(overlay, "ClusterRole") and not objects(overlay, "ClusterRoleBinding")
    roles = {r["metadata"]["name"]: r for r in objects(overlay, "Role")}
    granted: dict[str, set[tuple[str, str, str]]] = {}
    for b in objects(overlay, "RoleBinding"):
        assert b["roleRef"]["kind"] == "Role"
        rules = roles[b["roleRef"]["name"]]["rules"]
        perms = {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
        assert not any(rule.get("resourceNames") == [] for rule in rules)
        for s in b["subjects"]:
            assert s["kind"] == "ServiceAccount"
            if overlay in TOP:
                assert s.get("namespace") == "motor"
            granted.setdefault(s["name"], set()).update(perms)
    needed = set(API_CALLS.values())
    has_controller = bool([o for o in objects(overlay, "Deployment") if o["metadata"]["name"] == "motor-controller"])
    assert granted == ({"motor-controller": needed} if has_controller else {})
    # only pods whose account holds a grant get a token; that is the controller's
    for w, t in pod_templates(overlay):
        sa = t["spec"]["serviceAccountName"]
        assert t["spec"].get("automountServiceAccountToken") is (sa in granted), w["metadata"]["name"]
        if w["metadata"]["name"] == "motor-controller":
            assert sa == "motor-controller"
    for sa in objects(overlay, "ServiceAccount"):
        assert sa.get("automountServiceAccountToken") is False


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_and_budgets_select_pods_and_named_ports_exist(overlay: str) -> None:
    pods = [(t["metadata"]["labels"], {p["name"] for c in t["spec"]["containers"] for p in c.get("ports", [])})
            for _, t in pod_templates(overlay)]  # fmt: skip
    for svc in objects(overlay, "Service"):
        sel = svc["spec"]["selector"]
        matching = [ports for labels, ports in pods if sel.items() <= labels.items()]
        assert matching, f"Service {svc['metadata']['name']} selects no pod"
        for p in svc["spec"]["ports"]:
            assert all(p["targetPort"] in ports for ports in matching), f"{svc['metadata']['name']}: {p}"
    for pdb in objects(overlay, "PodDisruptionBudget"):
        sel = pdb["spec"]["selector"]["matchLabels"]
        assert any(sel.items() <= labels.items() for labels, _ in pods), pdb["metadata"]["name"]


def test_coordinator_services_management_lists_every_pod_inference_only_ready_ones() -> None:
    for overlay in OVERLAYS:
        mgmt = named(overlay, "Service", "motor-coordinator")
        assert mgmt["spec"]["clusterIP"] == "None" and mgmt["spec"]["publishNotReadyAddresses"] is True
        infer = named(overlay, "Service", "motor-coordinator-infer")
        assert not infer["spec"].get("publishNotReadyAddresses")
        sts = named(overlay, "StatefulSet", "motor-coordinator")
        assert sts["spec"]["serviceName"] == "motor-coordinator"
    assert named("standalone", "StatefulSet", "motor-coordinator")["spec"]["replicas"] == 1
    for overlay in ["managed", "managed-vllm", "managed-sglang", "dev"]:
        assert named(overlay, "StatefulSet", "motor-coordinator")["spec"]["replicas"] == 2
        assert named(overlay, "Deployment", "motor-controller")["spec"]["replicas"] == 2
        ctl = named(overlay, "Service", "motor-controller")
        assert not ctl["spec"].get("publishNotReadyAddresses")  # nodemanagers reach the acting one


# --- the programs accept what the manifests give them ---------------------------------------------
def _env(overlay: str, c: dict[str, Any], pod_name: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = re.sub(r"\$\(([A-Z_]+)\)", lambda m: env[m.group(1)], e["value"])
            continue
        src = e["valueFrom"]
        if "fieldRef" in src:
            env[e["name"]] = {"metadata.name": pod_name, "status.podIP": "10.1.2.3",
                              "metadata.namespace": "motor"}[src["fieldRef"]["fieldPath"]]  # fmt: skip
        else:
            ref = src["configMapKeyRef"]
            env[e["name"]] = named(overlay, "ConfigMap", ref["name"])["data"][ref["key"]]
    return env


def _config_file(overlay: str, t: dict[str, Any], c: dict[str, Any], tmp_path: Path) -> tuple[Path, str]:
    """The config file a container reads (from its ConfigMap volume), written to *tmp_path*."""
    mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
    vol = next(v for v in t["spec"]["volumes"] if v["name"] == "config")
    data = named(overlay, "ConfigMap", vol["configMap"]["name"])["data"][mount["subPath"]]
    path = tmp_path / mount["subPath"]
    path.write_text(data)
    return path, mount["mountPath"]


def _port(c: dict[str, Any], name: str) -> int:
    return int(next(p["containerPort"] for p in c["ports"] if p["name"] == name))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_programs_config_and_command_line_is_accepted_by_motor(overlay: str, tmp_path: Path) -> None:
    from motor_common.config import load_config
    from motor_controller.config import ControllerConfig
    from motor_coordinator.config import CoordinatorConfig
    from motor_coordinator.main import parse_args as coordinator_args
    from motor_gateway.main import build_config as gateway_config
    from motor_gateway.main import parse_args as gateway_args
    from motor_nodemanager import config as nmconfig

    seen = set()
    for w, t, c in containers(overlay):
        if not c["image"].startswith("motor"):
            continue
        name = w["metadata"]["name"]
        env = _env(overlay, c, f"{name}-0")
        argv = [*c.get("command", []), *c.get("args", [])]
        live, ready = c["livenessProbe"], c["readinessProbe"]
        if c["name"] == "gateway":
            gw = gateway_config(gateway_args(argv[1:]))
            assert gw.host == "0.0.0.0" and gw.port == _port(c, "http")
            expected = 2 if overlay != "standalone" else 1
            assert list(gw.coordinators) == [f"motor-coordinator-{i}.motor-coordinator:9100" for i in range(expected)]
            assert (live["httpGet"]["path"], ready["httpGet"]["path"]) == ("/health", "/ready")
        elif c["name"] == "coordinator":
            path, mounted = _config_file(overlay, t, c, tmp_path)
            args = coordinator_args(argv[1:])
            assert args.config == mounted
            cfg = load_config(CoordinatorConfig, path, env_prefix="MOTOR_COORDINATOR", environ=env)
            assert cfg.server.host == "0.0.0.0" and cfg.server.port == _port(c, "grpc") == live["grpc"]["port"]
            assert cfg.server.metrics_port == _port(c, "ops") and cfg.http.port == _port(c, "http")
            assert cfg.ha.enabled is (overlay != "standalone")
            if cfg.ha.enabled:
                assert cfg.ha.exit_on_lost and cfg.ha.advertise_address == "10.1.2.3:9100"
                assert cfg.ha.election_key == "/motor/motor/coordinator-leader"
        elif c["name"] == "controller":
            path, mounted = _config_file(overlay, t, c, tmp_path)
            assert argv == ["motor-controller", "--config", mounted]
            cfg = load_config(ControllerConfig, path, env_prefix="MOTOR_CONTROLLER", environ=env)
            assert cfg.server.port == _port(c, "grpc") == live["grpc"]["port"] and cfg.server.metrics_port == _port(c, "ops")
            assert cfg.store.backend == "etcd" and cfg.store.etcd_endpoints
            assert cfg.node_restart.backend == "kubernetes" and cfg.node_restart.namespace == "motor"
            assert cfg.ha.advertise_address == "10.1.2.3:9200"
            assert cfg.coordinators == ["motor-coordinator-0.motor-coordinator:9100", "motor-coordinator-1.motor-coordinator:9100"]
        elif c["name"] == "nodemanager":
            path, mounted = _config_file(overlay, t, c, tmp_path)
            assert argv == ["--config", mounted]  # the image's entrypoint is motor-nodemanager
            cfg = nmconfig.load(str(path), environ=env)
            assert cfg.role == w["metadata"]["labels"]["motor.io/role"]
            assert cfg.ip == "10.1.2.3" and cfg.server.host == "0.0.0.0" and cfg.job_name == f"{name}-0"
            assert cfg.server.port == _port(c, "grpc") == live["grpc"]["port"] and cfg.server.metrics_port == _port(c, "ops")
            assert cfg.base_port == _port(c, "engine")
            assert cfg.controller_address == "motor-controller:9200"
            assert c["image"] == f"motor-{cfg.engine_type}:0.1.0"
            pre = c["lifecycle"]["preStop"]["exec"]["command"]
            assert pre[:3] == ["/opt/motor/bin/python", "-m", "motor_nodemanager.prestop"]
            assert int(pre[pre.index("--drain-sec") + 1]) < t["spec"]["terminationGracePeriodSeconds"]
        else:
            raise AssertionError(f"unexpected Motor container {ident(w, c)}")
        seen.add(c["name"])
    expected = {"gateway", "coordinator"}
    if overlay != "standalone":
        expected.add("controller")
    if overlay not in ("standalone", "managed"):
        expected.add("nodemanager")
    assert seen == expected


def test_controller_pods_can_build_the_kubernetes_restarter_from_their_config(tmp_path: Path) -> None:
    """The managed controller's node_restart section, built the way motor-controller builds it, with
    in-cluster credentials laid out as in a pod (token + CA files, KUBERNETES_SERVICE_* env)."""
    from kubernetes.config import incluster_config

    from motor_common.config import load_config
    from motor_controller.config import ControllerConfig
    from motor_controller.node_restarter import KubernetesNodeRestarter, build_restarter

    w = named("managed-vllm", "Deployment", "motor-controller")
    t = w["spec"]["template"]
    c = t["spec"]["containers"][0]
    path, _ = _config_file("managed-vllm", t, c, tmp_path)
    env = _env("managed-vllm", c, "motor-controller-abc")
    cfg = load_config(ControllerConfig, path, env_prefix="MOTOR_CONTROLLER", environ=env)
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")  # read lazily by the client
    mp = pytest.MonkeyPatch()
    mp.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    mp.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    try:
        restarter = build_restarter(cfg.node_restart, None,  # type: ignore[arg-type]
                                    environ={**env, "KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"})
    finally:
        mp.undo()
    assert isinstance(restarter, KubernetesNodeRestarter) and restarter.namespace == "motor"


# --- images -----------------------------------------------------------------------------------------
DOCKERFILES = sorted((ROOT / "deploy" / "images").glob("Dockerfile*"))


def test_dockerfiles_pass_hadolint() -> None:
    assert [p.name for p in DOCKERFILES] == ["Dockerfile", "Dockerfile.sglang", "Dockerfile.vllm"]
    out = subprocess.run([tool("hadolint"), *map(str, DOCKERFILES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_would_catch_an_unpinned_base(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN pip install motor\n")
    out = subprocess.run([tool("hadolint"), str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "DL3006" in out.stdout


def test_images_copy_every_package_dir_run_non_root_and_have_a_healthcheck() -> None:
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    roots = sorted({w.split("/")[0] for w in pyproject["tool"]["setuptools"]["packages"]["find"]["where"]})
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    scripts = set(pyproject["project"]["scripts"])
    for df in DOCKERFILES:
        text = df.read_text()
        for r in roots:
            assert f"COPY {r} {r}" in text, f"{df.name} does not copy {r}/"
            assert f"!{r}/" in ignore, f".dockerignore excludes {r}/"
        froms = re.findall(r"^FROM (\S+)", text, re.M)
        assert all(f.startswith("${") for f in froms), f"{df.name}: base images come from pinned ARGs"
        for arg in re.findall(r"^ARG (\w+_IMAGE)=(\S+)", text, re.M):
            assert re.search(r":v?\d+\.\d+", arg[1]) and "latest" not in arg[1], f"{df.name}: {arg} not pinned"
        assert re.search(r"^USER 10001:10001$", text, re.M), f"{df.name}: non-root user"
        assert "HEALTHCHECK" in text
    # the engine images run the nodemanager as their entrypoint, under an init (tini) as PID 1 that
    # reaps the engine processes re-parented to it
    for df in DOCKERFILES[1:]:
        text = df.read_text()
        assert 'ENTRYPOINT ["/usr/bin/tini", "--", "/opt/motor/bin/motor-nodemanager"]' in text
        assert "COPY --from=wheel /usr/bin/tini-static /usr/bin/tini" in text
    # every program the manifests start is a console script of the package
    for overlay in OVERLAYS:
        for _, _, c in containers(overlay):
            if c["image"].startswith("motor:"):
                assert c["command"][0] in scripts


# --- keys: the engines' pods hold nothing that drives the controller or the coordinators ----------
def _made_secrets() -> dict[str, dict[str, str]]:
    out = subprocess.run([str(KUSTOMIZE / "make-secrets.sh"), "--dry-run"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PATH": f"{Path(tool('kubectl')).parent}:{os.environ['PATH']}"})
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert all(d["kind"] == "Secret" and d["metadata"]["namespace"] == "motor" for d in docs)
    return {d["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in d["data"].items()} for d in docs}


def _mount_secrets(overlay: str, t: dict[str, Any], c: dict[str, Any], root: Path,
                   secrets: dict[str, dict[str, str]]) -> set[str]:  # fmt: skip
    """Write the Secrets a container mounts under *root* + their mount paths; their names."""
    vols = {v["name"]: v["secret"]["secretName"] for v in t["spec"]["volumes"] if "secret" in v}
    mounted = set()
    for m in c["volumeMounts"]:
        if m["name"] in vols:
            mounted.add(vols[m["name"]])
            d = root / m["mountPath"].lstrip("/")
            d.mkdir(parents=True, exist_ok=True)
            for file, value in secrets[vols[m["name"]]].items():
                (d / file).write_text(value)
    return mounted


@pytest.mark.parametrize("overlay", ["managed-vllm", "managed-sglang"])
def test_engine_pods_hold_no_key_that_drives_the_controller_or_the_coordinators(overlay: str, tmp_path: Path) -> None:
    """make-secrets.sh's keys, mounted where the rendered pods mount them and read by the programs'
    own loaders: the controller's calls and the PreStop hook reach the nodemanager, the nodemanager
    registers with the controller, and nothing in the engine pod is the management key or any key
    the controller or a coordinator accepts as an operator."""
    from motor_common.config import load_config
    from motor_common.credentials import Authenticator, Role, presented_key
    from motor_common.grpc_server import read_secret
    from motor_controller.config import ControllerConfig
    from motor_nodemanager import config as nmconfig

    secrets = _made_secrets()
    assert set(secrets) == SECRETS
    management = secrets["motor-management-key"]["management.key"]
    node_key = secrets["motor-node-credentials"]["node.key"]

    def load(w: dict[str, Any], t: dict[str, Any], c: dict[str, Any]) -> tuple[Path, set[str]]:
        root = tmp_path / w["metadata"]["name"]
        mounted = _mount_secrets(overlay, t, c, root, secrets)
        path, _ = _config_file(overlay, t, c, root)
        path.write_text(path.read_text().replace("/etc/motor/", f"{root}/etc/motor/"))
        return path, mounted

    [(cw, ct, cc)] = [x for x in containers(overlay) if x[2]["name"] == "controller"]
    path, mounted = load(cw, ct, cc)
    ctl = load_config(ControllerConfig, path, env_prefix="MOTOR_CONTROLLER", environ=_env(overlay, cc, "ctl-0"))
    ctl_auth = Authenticator.from_config(ctl.server.auth, read_secret(ctl.server.management_key_file))
    nodes = [x for x in containers(overlay) if x[2]["name"] == "nodemanager"]
    assert len(nodes) == 2  # prefill, decode
    for w, t, c in nodes:
        path, mounted = load(w, t, c)
        assert mounted == {"motor-node-credentials"}, ident(w, c)
        cfg = nmconfig.load(str(path), environ=_env(overlay, c, f"{w['metadata']['name']}-0"))
        assert cfg.server.management_key_file is None
        nm_auth = Authenticator.from_config(cfg.server.auth, None)
        controller_calls = nm_auth.identify(management)  # the controller presents its management key
        assert controller_calls is not None and Role.OPERATOR in controller_calls.roles
        pre = c["lifecycle"]["preStop"]["exec"]["command"]
        prestop_key = (tmp_path / w["metadata"]["name"] / pre[pre.index("--key-file") + 1].lstrip("/")).read_text()
        assert nm_auth.identify(prestop_key) is not None  # the PreStop hook can pause its node
        presented = str(presented_key(cfg.server.auth, None))
        assert presented == node_key
        registering = ctl_auth.identify(presented)  # register, heartbeat: a node key, nothing more
        assert registering is not None and registering.roles == {Role.NODE}
        # everything the engines can read in this pod: no key the controller takes as an operator
        readable = [f.read_text() for f in (tmp_path / w["metadata"]["name"]).rglob("*") if f.is_file()]
        for text in readable:
            assert management not in text
            for token in text.replace(":", " ").split():
                who = ctl_auth.identify(token)
                assert who is None or Role.OPERATOR not in who.roles, f"{ident(w, c)}: an operator key"
