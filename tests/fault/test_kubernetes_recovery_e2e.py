"""Pod-level recovery end to end: a real fleet (motor-controller with ``node_restart.backend:
kubernetes``, coordinator, gateway, nodemanagers launching motor-sim engines) whose controller
reaches "the Kubernetes API" through the real ``kubernetes`` client and a kubeconfig. A two-node
instance loses one node; the controller restarts the survivor by deleting its pod. The API server
is the only stand-in (``tests/k8s_api.py``; no cluster can run here): on a pod DELETE it plays the
kubelet and the StatefulSet — SIGTERM to that pod's nodemanager, then the same pod (same name, same
config) starts again.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from motor_common.gen.motor.controller.v1 import controller_pb2 as cpb
from tests.fault.fleet import Fleet, fleet
from tests.fault.test_unhealthy_and_node_loss_e2e import kill_node
from tests.helpers import wait_for
from tests.k8s_api import DENIED, TOKEN, FakeApiServer, serve, write_kubeconfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

M0, M1, D0 = "motor-vllm-prefill-0", "motor-vllm-prefill-1", "motor-vllm-decode-0"


async def start_pods(f: Fleet) -> None:
    """A 2-node prefill instance and a decode instance; node id = pod name; a pod whose process
    ends comes back 2 s later (kubelet restart / StatefulSet reschedule)."""
    two = {"nodes_per_instance": 2, "restart_any_exit_after": 2.0}
    await f.add_node("m0", "job-m", "prefill", node_rank=0, node_id=M0, **two)
    await f.add_node("m1", "job-m", "prefill", node_rank=1, node_id=M1, **two)
    await f.add_node("d0", "job-d0", "decode", node_id=D0)
    await wait_for(lambda: f.active("job-m", "job-d0"), timeout=25, what="2-node P and D ACTIVE")


def kubelet(f: Fleet, api: FakeApiServer) -> Any:
    def on_delete(namespace: str, name: str) -> None:
        node = next(n for n in f.nodes.values() if n.config.get("node_id") == name)
        node.proc.proc.send_signal(signal.SIGTERM)  # graceful pod termination
        api.pods.add((namespace, name))  # the StatefulSet recreates it under the same name

    return on_delete


async def test_partial_loss_deletes_the_survivors_pod_and_the_instance_comes_back(tmp_path: Path) -> None:
    async with serve(FakeApiServer(pods={("motor", M0), ("motor", M1), ("motor", D0)})) as api:
        kc = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        restart = {"backend": "kubernetes", "namespace": "motor", "kubeconfig": str(kc), "wait_timeout_sec": 10.0}
        async with fleet(tmp_path / "fleet", controller_extra={"node_restart": restart}) as f:
            api.on_delete = kubelet(f, api)
            await start_pods(f)
            mi = await f.live_instance("job-m")
            assert mi is not None and sorted(mi.node_ids) == [M0, M1]
            survivor_pid = f.nodes["m0"].proc.proc.pid

            kill_node(f, "m1")  # its Kubernetes node is gone
            await wait_for(lambda: api.requests, timeout=15, what="the survivor's pod deleted")
            assert api.requests[0] == ("DELETE", f"/api/v1/namespaces/motor/pods/{M0}", f"Bearer {TOKEN}")
            await wait_for(lambda: f.nodes["m0"].restarts >= 1, timeout=15, what="the survivor's pod recreated")
            # terminated by the "kubelet" (SIGTERM → 0), not told to exit by StopNode (75)
            assert f.nodes["m0"].exit_codes[0] == 0 and f.nodes["m0"].proc.proc.pid != survivor_pid
            await wait_for(lambda: f.nodes["m1"].restarts >= 1, timeout=15, what="the lost pod rescheduled")
            await wait_for(lambda: f.active("job-m"), timeout=30, what="job-m ACTIVE again")
            again = await f.live_instance("job-m")
            assert again is not None and again.instance.id == mi.instance.id  # same pod names → same instance
            assert {r[1] for r in api.requests} == {f"/api/v1/namespaces/motor/pods/{M0}"}
            assert f.nodes["d0"].restarts == 0
            assert "restarting nodes (kubernetes)" in f.controller.log()


async def test_a_denied_pod_delete_fails_the_restart_with_the_api_servers_message(tmp_path: Path) -> None:
    async with serve(FakeApiServer()) as api:
        kc = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        restart = {"backend": "kubernetes", "namespace": "forbidden", "kubeconfig": str(kc), "wait_timeout_sec": 5.0}
        async with fleet(tmp_path / "fleet", controller_extra={"node_restart": restart}) as f:
            api.on_delete = kubelet(f, api)
            await start_pods(f)
            mi = await f.live_instance("job-m")
            assert mi is not None
            survivor_pid = f.nodes["m0"].proc.proc.pid
            kill_node(f, "m1")

            iid, failed = mi.instance.id, []

            async def node_restart_failed() -> bool:  # (the partial loss is retried: keep this answer)
                ft = await f.ft_status(iid)
                if ft.strategy == "node_restart" and ft.state == cpb.FAULT_TOLERANCE_STATE_FAILED:
                    failed.append(ft)
                return bool(failed)

            await wait_for(node_restart_failed, timeout=30, what="the node restart to fail")
            ft = failed[0]
            denied = DENIED.format(name=M0, ns="forbidden")
            assert denied in ft.last_error and "403 Forbidden" in ft.last_error
            assert api.requests[0] == ("DELETE", f"/api/v1/namespaces/forbidden/pods/{M0}", f"Bearer {TOKEN}")
            assert f.nodes["m0"].proc.proc.pid == survivor_pid and f.nodes["m0"].exit_codes == []  # untouched
            assert denied in f.controller.log()
