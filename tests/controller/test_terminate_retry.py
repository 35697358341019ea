"""TerminateInstance of an instance that is already deleted stops nothing (real Controller,
in-memory store and nodemanagers)."""

from __future__ import annotations

from dataclasses import replace

from motor_common.domain import Endpoint, EngineType, NodeSpec, Role
from motor_controller.config import ControllerConfig
from motor_controller.controller import Controller
from motor_controller.model import InstanceState, ManagedInstance, NodeRecord
from motor_controller.store import MemoryStore


class NodeManagers:
    def __init__(self) -> None:
        self.stopped: list[tuple[str, str]] = []

    async def stop_node(self, address: str, reason: str) -> None:
        self.stopped.append((address, reason))

    async def close(self) -> None:
        return None


SPEC = NodeSpec(node_id="job-p-n0", job_name="job", role=Role.PREFILL, ip="10.0.0.1", admin_port=9300,
                engine_type=EngineType.VLLM, model_name="m", node_rank=0, nodes_per_instance=1,
                endpoints=(Endpoint(id=0, ip="10.0.0.1", business_port=8000),))


async def test_a_retried_terminate_does_not_stop_the_nodes_of_the_instance_that_replaced_it() -> None:
    """Node ids survive a restart: after instance 111 is terminated its nodemanager comes back
    under the same id and serves instance 222. A retried TerminateInstance(111) (a client that
    timed out, the precision runbook's manual path) must not stop 222's node."""
    nms = NodeManagers()
    ctl = Controller(ControllerConfig(), MemoryStore(), nms)  # type: ignore[arg-type]
    ctl.nodes[SPEC.node_id] = NodeRecord(spec=SPEC, registered_at=1.0, registered_mono=1.0)
    first = ManagedInstance(id=111, job_name="job", incarnation=0, state=InstanceState.ACTIVE, instance=None,
                            node_ids=(SPEC.node_id,), master_address="", state_changed_at=0.0)
    ctl.instances[111] = first
    assert await ctl.terminate_instance(111, False, "first") == [SPEC.node_id]
    assert nms.stopped == [("10.0.0.1:9300", "instance 111 terminated")]
    assert ctl.instances[111].state is InstanceState.DELETED
    # the node re-registers under its stable id and a new instance is assembled on it
    ctl.nodes[SPEC.node_id] = NodeRecord(spec=SPEC, registered_at=2.0, registered_mono=2.0)
    ctl.instances[222] = replace(first, id=222, incarnation=1)
    nms.stopped.clear()
    assert await ctl.terminate_instance(111, False, "retry") == []
    assert nms.stopped == []
    assert ctl.instances[222].state is InstanceState.ACTIVE and SPEC.node_id in ctl.nodes
    assert ctl.instances[111].reason == "terminated: first"  # the first call's record stands
    await ctl.close()
