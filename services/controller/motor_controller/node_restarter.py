"""Node-level recovery behind one Protocol: how a node (pod) is restarted.

- :class:`StopNodeRestarter` (local fleet): calls the nodemanager's ``StopNode``; it stops its
  engines and exits with ``EXIT_RESCHEDULE`` (75), and its supervisor (``motor up``, systemd, a
  container restart policy) starts it again, like a kubelet would.
- :class:`KubernetesNodeRestarter`: deletes the pod named after the node id so its controller
  (StatefulSet, Deployment, Job) recreates it. :func:`kubernetes_pod_api` builds the real
  ``kubernetes`` client's ``CoreV1Api`` from the pod's ServiceAccount (in cluster) or a kubeconfig;
  it fails with a :class:`ConfigError` naming the problem, so a controller configured for Kubernetes
  that cannot talk to it never starts. Tested with the real client against a local HTTP server that
  speaks the pods API (``tests/controller/test_kubernetes_restarter.py``): no cluster ran here.

Errors are translated at this boundary: the API server's own message (its ``Status`` body) is kept,
an unreachable API server → ``Unavailable``; a pod that is already gone counts as restarted.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Mapping
from typing import Any, Protocol, cast

import orjson
import yaml

from motor_common.domain import NodeSpec
from motor_common.errors import ConfigError, Unavailable
from motor_controller.config import NodeRestartConfig
from motor_controller.peers import NodeManagers

# A pod name is a DNS-1123 subdomain.
_POD_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def valid_pod_name(name: str) -> bool:
    return len(name) <= 253 and _POD_NAME.match(name) is not None


class NodeRestarter(Protocol):
    name: str

    async def restart(self, node: NodeSpec, reason: str) -> None: ...


class StopNodeRestarter:
    name = "local"

    def __init__(self, node_managers: NodeManagers) -> None:
        self._nms = node_managers

    async def restart(self, node: NodeSpec, reason: str) -> None:
        await self._nms.stop_node(node.admin_address, reason)


class PodApi(Protocol):
    """The part of ``kubernetes.client.CoreV1Api`` used here (synchronous)."""

    def delete_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Any: ...


def api_message(exc: BaseException) -> str:
    """``STATUS Reason: message`` of a failed API call, the message taken from the API server's
    ``Status`` body when it sent one (e.g. the RBAC denial naming the user, verb and resource)."""
    status = getattr(exc, "status", None)
    if status is None:  # not an API answer: connection refused, timeout, TLS
        return f"{type(exc).__name__}: {exc}"
    message = ""
    body = getattr(exc, "body", None)
    if body:
        try:
            parsed = orjson.loads(body)
            if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
                message = parsed["message"]
        except orjson.JSONDecodeError:
            message = str(body)[:500]
    reason = getattr(exc, "reason", None) or ""
    return f"{status} {reason}: {message}" if message else f"{status} {reason}".rstrip()


class KubernetesNodeRestarter:
    name = "kubernetes"

    def __init__(self, api: PodApi, namespace: str, *, timeout: float = 10.0) -> None:
        self._api = api
        self.namespace = namespace
        self._timeout = timeout

    async def restart(self, node: NodeSpec, reason: str) -> None:
        if not valid_pod_name(node.node_id):
            raise Unavailable(
                f"node id {node.node_id!r} is not a pod name: with node_restart.backend kubernetes "
                "each nodemanager must run in its own pod with node_id = the pod name (POD_NAME "
                "from the downward API)",
                reason="POD_DELETE_FAILED",
            )
        try:
            await asyncio.to_thread(
                self._api.delete_namespaced_pod,
                name=node.node_id,
                namespace=self.namespace,
                _request_timeout=self._timeout,
            )
        except Exception as exc:  # the client raises ApiException / urllib3 errors
            if getattr(exc, "status", None) == 404:
                return  # already gone: its controller is recreating it
            raise Unavailable(
                f"deleting pod {self.namespace}/{node.node_id} failed: {api_message(exc)}",
                reason="POD_DELETE_FAILED",
            ) from exc


def kubernetes_pod_api(kubeconfig: str = "", environ: Mapping[str, str] | None = None) -> PodApi:
    """The real client: in cluster (``KUBERNETES_SERVICE_HOST`` set, no *kubeconfig*) the pod's
    ServiceAccount token; otherwise *kubeconfig*, else ``$KUBECONFIG``, else ``~/.kube/config``.
    Raises :class:`ConfigError` saying what is missing."""
    env = os.environ if environ is None else environ
    try:
        from kubernetes import client, config
    except ImportError as exc:
        raise ConfigError(
            "node_restart.backend is kubernetes but the 'kubernetes' package is not installed "
            "(pip install 'motor-pd[k8s]')"
        ) from exc
    from kubernetes.config import incluster_config

    conf = client.Configuration()
    if not kubeconfig and env.get("KUBERNETES_SERVICE_HOST"):
        try:
            incluster_config.InClusterConfigLoader(
                token_filename=incluster_config.SERVICE_TOKEN_FILENAME,
                cert_filename=incluster_config.SERVICE_CERT_FILENAME,
                environ=env,
            ).load_and_set(conf)
        except config.ConfigException as exc:
            raise ConfigError(
                f"node_restart.backend is kubernetes: in-cluster credentials unusable: {exc} "
                "(is a ServiceAccount token mounted? automountServiceAccountToken must be true)"
            ) from exc
    else:
        path = kubeconfig or env.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        try:
            config.load_kube_config(config_file=path, client_configuration=conf)
        except (config.ConfigException, OSError, ValueError, yaml.YAMLError) as exc:
            raise ConfigError(
                f"node_restart.backend is kubernetes but no Kubernetes credentials: not in a cluster "
                f"(KUBERNETES_SERVICE_HOST unset) and kubeconfig {path} is unusable: {exc}"
            ) from exc
    return cast(PodApi, client.CoreV1Api(client.ApiClient(conf)))


def build_restarter(
    cfg: NodeRestartConfig, node_managers: NodeManagers, environ: Mapping[str, str] | None = None
) -> NodeRestarter:
    """The configured restarter; :class:`ConfigError` when the Kubernetes backend cannot be set up."""
    if cfg.backend == "kubernetes":
        return KubernetesNodeRestarter(
            kubernetes_pod_api(cfg.kubeconfig, environ), cfg.namespace, timeout=cfg.api_timeout_sec
        )
    return StopNodeRestarter(node_managers)
