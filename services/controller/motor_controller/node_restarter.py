"""Node-level recovery behind one Protocol: how a node (pod) is restarted.

- :class:`StopNodeRestarter` (local fleet): calls the nodemanager's ``StopNode``; it stops its
  engines and exits with ``EXIT_RESCHEDULE`` (75), and its supervisor (``motor up``, systemd, a
  container restart policy) starts it again, like a kubelet would.
- :class:`KubernetesNodeRestarter`: deletes the pod named after the node id so its controller
  (StatefulSet, Job, volcano podgroup) recreates it. The Kubernetes API object is injected
  (:class:`PodApi`); :func:`kubernetes_pod_api` builds the real one from in-cluster or kubeconfig
  credentials. Unit-tested against a fake API object only: there is no cluster here.

Errors are translated at this boundary: an unreachable API server → ``Unavailable``; a pod that is
already gone counts as restarted.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, cast

from motor_common.domain import NodeSpec
from motor_common.errors import Unavailable
from motor_controller.config import NodeRestartConfig
from motor_controller.peers import NodeManagers


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


class KubernetesNodeRestarter:
    name = "kubernetes"

    def __init__(self, api: PodApi, namespace: str, *, timeout: float = 10.0) -> None:
        self._api = api
        self.namespace = namespace
        self._timeout = timeout

    async def restart(self, node: NodeSpec, reason: str) -> None:
        try:
            await asyncio.to_thread(
                self._api.delete_namespaced_pod,
                name=node.node_id,
                namespace=self.namespace,
                _request_timeout=self._timeout,
            )
        except Exception as exc:  # the client raises ApiException / urllib3 errors
            status = getattr(exc, "status", None)
            if status == 404:
                return  # already gone: its controller is recreating it
            raise Unavailable(
                f"deleting pod {self.namespace}/{node.node_id} failed: {status or type(exc).__name__}: "
                f"{getattr(exc, 'reason', None) or exc}",
                reason="POD_DELETE_FAILED",
            ) from exc


def kubernetes_pod_api() -> PodApi:  # pragma: no cover - needs a cluster
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return cast(PodApi, client.CoreV1Api())


def build_restarter(cfg: NodeRestartConfig, node_managers: NodeManagers) -> NodeRestarter:
    if cfg.backend == "kubernetes":
        return KubernetesNodeRestarter(kubernetes_pod_api(), cfg.namespace)
    return StopNodeRestarter(node_managers)
