"""Fault manager (fake host and strategies), Kubernetes/StopNode restarters (fake API), partial loss."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes.client.exceptions import ApiException
from prometheus_client import REGISTRY

from motor_common.domain import EndpointStatus, EngineType, Instance, Role
from motor_common.errors import Unavailable
from motor_controller.config import FaultToleranceConfig
from motor_controller.fault_manager import FaultManager
from motor_controller.fault_policy import (
    AWAIT_RECOVERY,
    ENGINE_RELAUNCH,
    NODE_RESTART,
    FtState,
    Outcome,
    Progress,
    StrategyResult,
)
from motor_controller.model import FaultReport, InstanceState, ManagedInstance, NodeState
from motor_controller.node_restarter import KubernetesNodeRestarter, StopNodeRestarter
from motor_controller.reconcile import World, partial_loss
from motor_controller.strategies.await_recovery import AwaitRecovery
from tests.controller.factories import obs, record, spec
from tests.helpers import wait_for

ON = FaultToleranceConfig(enable_fault_tolerance=True)


def managed(iid: int = 1, state: InstanceState = InstanceState.ACTIVE, nodes: tuple[str, ...] = ("a",)) -> ManagedInstance:
    inst = Instance(iid, Role.PREFILL, "job", "m", EngineType.VLLM, spec().endpoints)
    return ManagedInstance(iid, "job", 0, state, inst, nodes, "", 0.0)


def dead(iid: int = 1, level: str = "engine_dead") -> FaultReport:
    return FaultReport("a", iid, 0, level, "process_exit", 9, "", 0.0)


@dataclass
class Host:
    instances: dict[int, ManagedInstance] = field(default_factory=dict)
    healthy: bool = True
    scale_down_ok: bool = True
    ended: list[tuple[int, StrategyResult]] = field(default_factory=list)

    def instance(self, instance_id: int) -> ManagedInstance | None:
        return self.instances.get(instance_id)

    def instance_healthy(self, instance_id: int) -> bool:
        return self.healthy

    async def begin_recovery(self, instance_id: int, strategy: str) -> bool:
        self.instances[instance_id] = replace(self.instances[instance_id], state=InstanceState.RECOVERING)
        return True

    async def end_recovery(self, instance_id: int, result: StrategyResult) -> None:
        self.ended.append((instance_id, result))
        self.instances[instance_id] = replace(self.instances[instance_id], state=InstanceState.ACTIVE)

    def scale_down_eligible(self, instance_id: int, report: FaultReport) -> bool:
        return self.scale_down_ok


@dataclass
class FakeStrategy:
    name: str
    result: StrategyResult
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, instance: ManagedInstance) -> StrategyResult:
        await self.gate.wait()
        return self.result

    async def stop(self) -> None:
        pass


class Factory:
    def __init__(self, outcome: Outcome = Outcome.DONE) -> None:
        self.outcome = outcome
        self.built: list[tuple[str, tuple[str, ...]]] = []
        self.last: FakeStrategy | None = None

    def __call__(self, name: str, mi: ManagedInstance, progress: Progress, nodes: Sequence[str],
                 spawn: Any) -> FakeStrategy:  # fmt: skip
        self.built.append((name, tuple(nodes)))
        self.last = FakeStrategy(name, StrategyResult(self.outcome, "x"))
        return self.last


async def test_engine_dead_runs_a_relaunch_while_recovering_and_one_at_a_time() -> None:
    host = Host({1: managed()})
    build = Factory()
    fm = FaultManager(lambda: ON, host, build)
    assert await fm.on_fault(dead())  # relaunch expected: the nodemanager freezes
    assert host.instances[1].state is InstanceState.RECOVERING
    assert fm.progress[1].state is FtState.RUNNING and fm.progress[1].strategy == ENGINE_RELAUNCH
    assert await fm.on_fault(dead())  # joins the running relaunch
    assert len(build.built) == 1
    assert build.last is not None
    build.last.gate.set()
    await wait_for(lambda: host.ended, timeout=2, what="strategy end")
    assert host.ended[0][1].outcome is Outcome.DONE and fm.progress[1].state is FtState.IDLE
    await fm.close()


async def test_disabled_fault_tolerance_or_relaunch_start_nothing_for_a_dead_engine() -> None:
    host = Host({1: managed()})
    build = Factory()
    assert not await FaultManager(lambda: FaultToleranceConfig(), host, build).on_fault(dead())
    off = FaultToleranceConfig(enable_fault_tolerance=True, enable_engine_relaunch=False)
    assert not await FaultManager(lambda: off, host, build).on_fault(dead())
    assert build.built == [] and host.instances[1].state is InstanceState.ACTIVE


async def test_unhealthy_awaits_recovery_and_never_relaunches_when_it_recovers() -> None:
    host = Host({1: managed()})
    build = Factory()
    fm = FaultManager(lambda: ON, host, build)
    assert await fm.on_fault(dead(level="engine_unhealthy"))  # freeze: the chain may end in a relaunch
    assert [b[0] for b in build.built] == [AWAIT_RECOVERY]
    assert host.instances[1].state is InstanceState.RECOVERING
    assert build.last is not None
    build.last.gate.set()
    await wait_for(lambda: host.ended, timeout=2, what="strategy end")
    assert host.ended[0][1].outcome is Outcome.DONE and [b[0] for b in build.built] == [AWAIT_RECOVERY]
    assert 1 not in fm.failed
    await fm.close()


def results_count(strategy: str, outcome: Outcome) -> float:
    value = REGISTRY.get_sample_value("motor_controller_recovery_results_total",
                                      {"strategy": strategy, "outcome": outcome.value})
    assert value is not None, "every strategy/outcome pair is exported from the start"
    return value


async def test_failed_await_recovery_escalates_at_once_to_a_relaunch_in_the_same_recovery() -> None:
    before = {(s, o): results_count(s, o) for s in (AWAIT_RECOVERY, ENGINE_RELAUNCH) for o in Outcome}
    host = Host({1: managed()})
    build = Factory(Outcome.FAILED)
    fm = FaultManager(lambda: ON, host, build)
    assert await fm.on_fault(dead(level="engine_unhealthy"))
    first = build.last
    assert first is not None
    first.gate.set()
    await wait_for(lambda: len(build.built) == 2, timeout=2, what="escalation")
    assert [b[0] for b in build.built] == [AWAIT_RECOVERY, ENGINE_RELAUNCH]
    assert host.ended == [] and host.instances[1].state is InstanceState.RECOVERING  # one recovery
    assert fm.running[1].name == ENGINE_RELAUNCH and fm.progress[1].strategy == ENGINE_RELAUNCH
    assert build.last is not None
    build.last.gate.set()
    await wait_for(lambda: host.ended, timeout=2, what="strategy end")
    assert fm.failed[1] == ENGINE_RELAUNCH
    # motor_controller_recovery_results_total: the wait failed, then the relaunch failed
    moved = {k: results_count(*k) - v for k, v in before.items() if results_count(*k) != v}
    assert moved == {(AWAIT_RECOVERY, Outcome.FAILED): 1, (ENGINE_RELAUNCH, Outcome.FAILED): 1}
    await fm.close()


async def test_failed_await_recovery_without_engine_relaunch_escalates_to_node_restart() -> None:
    host = Host({1: managed()})
    build = Factory(Outcome.FAILED)
    off = FaultToleranceConfig(enable_fault_tolerance=True, enable_engine_relaunch=False)
    fm = FaultManager(lambda: off, host, build)
    assert not await fm.on_fault(dead(level="engine_unhealthy"))  # no relaunch: no freeze
    assert build.last is not None
    build.last.gate.set()
    await wait_for(lambda: len(build.built) == 2, timeout=2, what="escalation")
    assert [b[0] for b in build.built] == [AWAIT_RECOVERY, NODE_RESTART]
    build.last.gate.set()
    await fm.close()


async def test_a_dead_report_while_awaiting_recovery_stops_the_wait() -> None:
    host = Host({1: managed()})
    fm = FaultManager(lambda: ON, host, lambda *a: AwaitRecovery(ON, a[2], healthy=lambda i: False,
                                                                  deleted=lambda i: False))  # fmt: skip
    assert await fm.on_fault(dead(level="engine_unhealthy"))
    assert await fm.on_fault(dead())  # joins; relaunch expected
    await wait_for(lambda: fm.results, timeout=2, what="await recovery to stop")
    assert fm.results[0][1] == AWAIT_RECOVERY and fm.results[0][2].outcome is Outcome.FAILED
    assert "dead" in fm.results[0][2].detail
    await fm.close()


async def test_a_failed_strategy_is_remembered_and_the_next_decision_escalates() -> None:
    host = Host({1: managed()})
    build = Factory(Outcome.FAILED)
    fm = FaultManager(lambda: ON, host, build)
    fm.failed[1] = "dp_scale_down"  # a strategy that expected recovery without a restart failed
    assert await fm.on_fault(dead(level="engine_unhealthy"))  # escalates to relaunch
    assert build.built[-1][0] == ENGINE_RELAUNCH
    assert build.last is not None
    build.last.gate.set()
    await wait_for(lambda: host.ended, timeout=2, what="strategy end")
    assert fm.failed[1] == ENGINE_RELAUNCH and fm.progress[1].state is FtState.FAILED
    assert not await fm.on_fault(dead())  # relaunch failed before: node restart, no freeze
    assert build.built[-1][0] == NODE_RESTART
    await fm.close()


async def test_partial_loss_restarts_only_the_survivors() -> None:
    host = Host({1: managed(nodes=("a", "b"))})
    build = Factory()
    fm = FaultManager(lambda: ON, host, build)
    await fm.on_partial_loss(1, ["b"])
    assert build.built == [(NODE_RESTART, ("b",))]
    await fm.close()


def test_partial_loss_is_found_only_when_some_but_not_all_nodes_are_lost() -> None:
    a, b = spec(0, n=2), spec(1, n=2)
    mi = replace(managed(nodes=(a.node_id, b.node_id)), state=InstanceState.INACTIVE)
    nodes = {a.node_id: record(a), b.node_id: record(b)}

    def world(observations: dict[str, Any], now: float = 10.0) -> World:
        return World(nodes, observations, {1: mi}, {}, {}, now, 0.0, 0.0, 1.0, 29550)

    fresh = obs(9.9, 1, [EndpointStatus.NORMAL])
    stale = obs(1.0, 1, [EndpointStatus.NORMAL])
    stopping = obs(9.9, 1, [EndpointStatus.NORMAL], state=NodeState.STOPPING)
    assert partial_loss(mi, world({a.node_id: fresh, b.node_id: stale})) == (a.node_id,)
    assert partial_loss(mi, world({a.node_id: stale, b.node_id: stale})) == ()
    assert partial_loss(mi, world({a.node_id: fresh, b.node_id: fresh})) == ()
    assert partial_loss(mi, world({a.node_id: stopping, b.node_id: stale})) == ()
    assert partial_loss(mi, world({a.node_id: fresh, b.node_id: stale}, now=0.5)) == ()  # just restarted


# --- restarters -----------------------------------------------------------------------------------
class FakePodApi:
    def __init__(self, error: Exception | None = None) -> None:
        self.deleted: list[tuple[str, str]] = []
        self.error = error

    def delete_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Any:
        if self.error is not None:
            raise self.error
        self.deleted.append((namespace, name))
        return {"metadata": {"name": name}}


async def test_kubernetes_restarter_deletes_the_pod_named_after_the_node() -> None:
    api = FakePodApi()
    await KubernetesNodeRestarter(api, "motor").restart(spec(0, node_id="prefill-0"), "partial loss")
    assert api.deleted == [("motor", "prefill-0")]


async def test_kubernetes_restarter_treats_a_missing_pod_as_restarted_and_translates_errors() -> None:
    await KubernetesNodeRestarter(FakePodApi(ApiException(status=404, reason="Not Found")), "m").restart(spec(), "x")
    try:
        await KubernetesNodeRestarter(FakePodApi(ApiException(status=403, reason="Forbidden")), "m").restart(spec(), "x")
    except Unavailable as exc:
        assert exc.reason == "POD_DELETE_FAILED" and "403" in exc.message
    else:  # pragma: no cover
        raise AssertionError("expected Unavailable")


async def test_stop_node_restarter_calls_stop_node_on_the_admin_address() -> None:
    calls: list[tuple[str, str]] = []

    class NMs:
        async def stop_node(self, address: str, reason: str) -> None:
            calls.append((address, reason))

    await StopNodeRestarter(NMs()).restart(spec(0), "why")  # type: ignore[arg-type]
    assert calls == [("10.0.0.1:7000", "why")]


async def test_close_gives_fire_and_forget_aborts_a_moment() -> None:
    host = Host({1: managed()})
    fm = FaultManager(lambda: ON, host, Factory())
    done: list[bool] = []

    async def abort() -> None:
        await asyncio.sleep(0.01)
        done.append(True)

    coro: Coroutine[Any, Any, None] = abort()
    fm._spawn_abort(coro)
    await fm.close()
    assert done == [True]
