"""Fault strategies without sockets: in-memory nodemanagers, pure decisions, phase-2 abort targeting."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest

from motor_common.domain import EndpointHealth, EndpointStatus
from motor_common.errors import Aborted, Internal, MotorError, NotFound, Unavailable
from motor_controller.config import FaultToleranceConfig
from motor_controller.fault_policy import Outcome, Progress
from motor_controller.model import (
    InstanceState,
    ManagedInstance,
    NodeState,
    NodeStatus,
)
from motor_controller.node_restarter import StopNodeRestarter
from motor_controller.strategies.await_recovery import AwaitRecovery, recovery_verdict
from motor_controller.strategies.engine_relaunch import (
    Dispatch,
    EngineRelaunch,
    Target,
    abort_targets,
    classify_dispatch_error,
    dispatch_timeout,
    relaunch_complete,
    resume_plan,
    unreachable_exceeded,
)
from motor_controller.strategies.node_restart import NodeRestart, restart_summary
from tests.controller.factories import spec
from tests.helpers import wait_for

IID = 7
CFG = FaultToleranceConfig(
    enable_fault_tolerance=True,
    engine_relaunch_complete_timeout_sec=1.0,
    engine_relaunch_poll_interval_sec=0.01,
    engine_relaunch_dispatch_retries=2,
    engine_relaunch_nm_unreachable_threshold=3,
)


def managed(iid: int, nodes: tuple[str, ...] = ("a", "b")) -> ManagedInstance:
    return ManagedInstance(iid, "job", 0, InstanceState.RECOVERING, None, nodes, "", 0.0)


def status(instance_id: int = IID, *statuses: EndpointStatus, state: NodeState = NodeState.RUNNING) -> NodeStatus:
    eps = tuple(EndpointHealth(i, s) for i, s in enumerate(statuses or (EndpointStatus.NORMAL,)))
    return NodeStatus("n", state, instance_id, eps)


# --- pure decisions ----------------------------------------------------------------------------------
def test_dispatch_errors_are_classified() -> None:
    assert classify_dispatch_error(Aborted("x", reason="RELAUNCH_IN_PROGRESS")) is Dispatch.DISPATCHED
    assert classify_dispatch_error(Aborted("x", reason="SNAPSHOT_RESTORING")) is Dispatch.RETRY
    assert classify_dispatch_error(Unavailable("x")) is Dispatch.RETRY
    assert classify_dispatch_error(Internal("x")) is Dispatch.FAILED
    assert classify_dispatch_error(NotFound("x")) is Dispatch.FAILED


def test_relaunch_is_complete_only_when_every_endpoint_of_the_instance_is_normal() -> None:
    assert relaunch_complete(status(IID, EndpointStatus.NORMAL, EndpointStatus.NORMAL), IID)
    assert not relaunch_complete(status(IID, EndpointStatus.NORMAL, EndpointStatus.INITIAL), IID)
    assert not relaunch_complete(status(IID + 1), IID)
    assert not relaunch_complete(status(IID, state=NodeState.RELAUNCHING), IID)
    assert not relaunch_complete(NodeStatus("n", NodeState.RUNNING, IID, ()), IID)


def test_phase_two_aborts_only_nodes_whose_restart_was_not_dispatched() -> None:
    targets = [Target("a", "h:1"), Target("b", "h:2"), Target("c", "h:3")]
    assert abort_targets(targets, {"b"}) == [Target("a", "h:1"), Target("c", "h:3")]
    assert abort_targets(targets, {"a", "b", "c"}) == []
    assert abort_targets(targets, set()) == targets


def test_a_resumed_relaunch_commands_only_the_nodes_the_previous_controller_did_not_reach() -> None:
    targets = [Target("a", "h:1"), Target("b", "h:2"), Target("c", "h:3")]
    dead = status(IID, EndpointStatus.ABNORMAL)
    todo, relaunching = resume_plan(
        targets, [status(), status(IID, EndpointStatus.INITIAL, state=NodeState.RELAUNCHING), dead], IID)
    assert todo == [Target("c", "h:3")] and relaunching == ["b"]  # a: relaunched already (NORMAL)
    assert resume_plan(targets, [status(), status(), status()], IID) == ([], [])  # finished meanwhile
    assert resume_plan(targets[:1], [status(IID + 1)], IID) == ([Target("a", "h:1")], [])


def test_unreachable_threshold() -> None:
    assert unreachable_exceeded({"a": 2, "b": 3}, 3) == ["b"]


# --- the strategy against in-memory nodemanagers -----------------------------------------------------
@dataclass
class FakeNodeManagers:
    statuses: dict[str, list[NodeStatus | MotorError]] = field(default_factory=dict)
    restart_errors: dict[str, list[MotorError]] = field(default_factory=dict)
    abort_errors: dict[str, MotorError] = field(default_factory=dict)
    restarts: list[str] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)
    stops: list[str] = field(default_factory=list)
    block_restart: asyncio.Event | None = None
    timeouts: list[float] = field(default_factory=list)

    async def start_engines(self, cmd: Any) -> None:  # pragma: no cover - unused
        raise NotImplementedError

    async def stop_node(self, address: str, reason: str) -> None:
        self.stops.append(address)

    async def get_status(self, address: str) -> NodeStatus:
        seq = self.statuses.get(address, [])
        item = seq.pop(0) if len(seq) > 1 else (seq[0] if seq else status())
        if isinstance(item, MotorError):
            raise item
        return item

    async def restart_engine(self, address: str, instance_id: int, *, abort: bool, timeout: float) -> int:
        if abort:
            self.aborts.append(address)
            if address in self.abort_errors:
                raise self.abort_errors[address]
            return 0
        self.restarts.append(address)
        self.timeouts.append(timeout)
        if self.block_restart is not None:
            await self.block_restart.wait()
        errs = self.restart_errors.get(address)
        if errs:
            raise errs.pop(0)
        return 1

    async def close(self) -> None:
        pass


TARGETS = [Target("a", "a:1"), Target("b", "b:1")]


def strategy(nms: FakeNodeManagers, *, deleted: bool = False, spawned: list[Any] | None = None,
             resumed: bool = False) -> EngineRelaunch:
    def spawn(coro: Coroutine[Any, Any, None]) -> None:
        (spawned if spawned is not None else []).append(asyncio.get_running_loop().create_task(coro))

    return EngineRelaunch(nms, CFG, TARGETS, Progress(), deleted=lambda _: deleted, spawn=spawn, resumed=resumed)


async def test_a_relaunch_resumed_before_its_dispatch_commands_the_dead_engine_now() -> None:
    """The controller died between the fault report and the RestartEngine call: the nodemanager
    waits (self-termination frozen) with its engine dead; the next controller must command it."""
    dead = status(IID, EndpointStatus.ABNORMAL)
    nms = FakeNodeManagers(statuses={"a:1": [dead, status()], "b:1": [status(IID, state=NodeState.RELAUNCHING),
                                                                      status()]})
    result = await strategy(nms, resumed=True).run(managed(IID))
    assert result.outcome is Outcome.DONE and nms.restarts == ["a:1"] and nms.aborts == []


async def test_a_relaunch_that_finished_while_the_controller_was_away_restarts_nothing() -> None:
    nms = FakeNodeManagers()  # every node runs the instance, all NORMAL
    result = await strategy(nms, resumed=True).run(managed(IID))
    assert result.outcome is Outcome.DONE and "away" in result.detail
    assert nms.restarts == [] and nms.aborts == []


async def test_phase_one_relaunches_every_node_and_is_done_when_all_normal() -> None:
    nms = FakeNodeManagers(statuses={"a:1": [status(), status(IID, EndpointStatus.INITIAL), status()]})
    s = strategy(nms)
    result = await s.run(managed(IID))
    assert result.outcome is Outcome.DONE
    assert sorted(nms.restarts) == ["a:1", "b:1"] and nms.aborts == []
    assert s.progress.relaunch_attempts == 1 and s.progress.phase == "done"


async def test_an_unreachable_nodemanager_at_probe_goes_to_phase_two_and_aborts_everyone() -> None:
    nms = FakeNodeManagers(statuses={"b:1": [Unavailable("down")]})
    result = await strategy(nms).run(managed(IID))
    assert result.outcome is Outcome.FAILED and "unreachable" in result.detail
    assert nms.restarts == [] and sorted(nms.aborts) == ["a:1", "b:1"]


async def test_transient_dispatch_errors_are_retried_within_the_budget() -> None:
    nms = FakeNodeManagers(restart_errors={"a:1": [Unavailable("blip"), Unavailable("blip")]})
    result = await strategy(nms).run(managed(IID))
    assert result.outcome is Outcome.DONE and nms.restarts.count("a:1") == 3


async def test_a_failed_relaunch_aborts_only_the_nodes_not_dispatched() -> None:
    nms = FakeNodeManagers(restart_errors={"a:1": [Internal("Failed to relaunch engine: refused")]})
    s = strategy(nms)
    result = await s.run(managed(IID))
    assert result.outcome is Outcome.FAILED and "refused" in result.detail
    assert nms.aborts == ["a:1"]  # b is relaunching: it stays frozen
    assert s.dispatched == {"b"} and s.progress.last_error


async def test_a_failed_abort_is_logged_as_an_error_naming_the_node(caplog: pytest.LogCaptureFixture) -> None:
    nms = FakeNodeManagers(
        restart_errors={"a:1": [Internal("boom")]}, abort_errors={"a:1": Unavailable("gone")}
    )
    await strategy(nms).run(managed(IID))
    assert any(r.levelname == "ERROR" and "abort failed for nodemanager a" in r.getMessage() for r in caplog.records)


async def test_not_normal_in_time_goes_to_phase_two() -> None:
    nms = FakeNodeManagers(statuses={"a:1": [status(IID, EndpointStatus.ABNORMAL)]})
    result = await strategy(nms).run(managed(IID))
    assert result.outcome is Outcome.FAILED and "not NORMAL within" in result.detail
    assert nms.aborts == []  # everyone was dispatched


async def test_a_nodemanager_lost_while_polling_goes_to_phase_two() -> None:
    err = Unavailable("down")
    nms = FakeNodeManagers(statuses={"a:1": [status(), err, err, err, err]})
    result = await strategy(nms).run(managed(IID))
    assert result.outcome is Outcome.FAILED and "unreachable while relaunching: a" in result.detail


async def test_a_deleted_instance_stops_the_relaunch_early() -> None:
    nms = FakeNodeManagers()
    result = await strategy(nms, deleted=True).run(managed(IID))
    assert result.outcome is Outcome.ABORTED and nms.restarts == []


async def test_an_interrupted_relaunch_fires_an_abort_to_every_node() -> None:
    nms = FakeNodeManagers(block_restart=asyncio.Event())
    spawned: list[asyncio.Task[None]] = []
    s = strategy(nms, spawned=spawned)
    task = asyncio.get_running_loop().create_task(s.run(managed(IID)))
    await wait_for(lambda: len(nms.restarts) == 2, timeout=2, interval=0.001, what="both restarts dispatched")
    await s.stop()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.gather(*spawned)
    assert sorted(nms.aborts) == ["a:1", "b:1"]


# --- node restart ---------------------------------------------------------------------------------------
def test_restart_summary() -> None:
    assert restart_summary(["a"], [], []).outcome is Outcome.DONE
    assert restart_summary(["a", "b"], ["b"], []).outcome is Outcome.FAILED
    assert restart_summary(["a"], [], ["a"]).outcome is Outcome.FAILED


async def test_node_restart_restarts_the_targets_and_waits_until_they_are_gone() -> None:
    nms = FakeNodeManagers()
    gone: set[str] = set()
    s = NodeRestart(StopNodeRestarter(nms), [spec(0, node_id="a"), spec(1, node_id="b")], Progress(), reason="partial loss",
                    gone=lambda n: n in gone, wait_timeout=2.0, poll_interval=0.01)  # fmt: skip
    task = asyncio.get_running_loop().create_task(s.run(managed(IID)))
    await wait_for(lambda: len(nms.stops) == 2, timeout=2, what="both StopNode calls")
    assert not task.done()
    gone.update({"a", "b"})
    assert (await task).outcome is Outcome.DONE


async def test_a_failed_node_restart_carries_the_restarters_message() -> None:
    class Denied:
        name = "kubernetes"

        async def restart(self, node: Any, reason: str) -> None:
            raise Unavailable(f"deleting pod m/{node.node_id} failed: 403 Forbidden: no delete for you",
                              reason="POD_DELETE_FAILED")

    s = NodeRestart(Denied(), [spec(0, node_id="a")], Progress(), reason="x",
                    gone=lambda n: False, wait_timeout=0.05, poll_interval=0.01)  # fmt: skip
    result = await s.run(managed(IID))
    assert result.outcome is Outcome.FAILED
    assert result.detail == "restart failed for a (deleting pod m/a failed: 403 Forbidden: no delete for you)"


# --- engine relaunch: config-derived RestartEngine deadline -----------------------------------------
def test_restart_call_deadline_is_what_is_left_of_the_relaunch_plus_a_margin() -> None:
    assert dispatch_timeout(deadline=100.0, now=40.0, margin=5.0) == 65.0
    assert dispatch_timeout(deadline=100.0, now=120.0, margin=5.0) == 5.0


async def test_restart_engine_calls_are_bounded_by_the_relaunch_timeout_not_a_fixed_minute() -> None:
    nms = FakeNodeManagers()
    s = EngineRelaunch(nms, CFG, TARGETS, Progress(), deleted=lambda _: False, spawn=lambda c: c.close(),
                       call_margin=0.5)  # fmt: skip
    assert (await s.run(managed(IID))).outcome is Outcome.DONE
    assert nms.timeouts and all(0.5 < t <= CFG.engine_relaunch_complete_timeout_sec + 0.5 for t in nms.timeouts)


# --- await recovery (ENGINE_UNHEALTHY) --------------------------------------------------------------
def test_recovery_verdict() -> None:
    v = recovery_verdict
    assert v(now=5, deadline=10, healthy_since=None, stable_sec=1, dead=False) is None
    assert v(now=5, deadline=10, healthy_since=4.5, stable_sec=1, dead=False) is None  # not stable yet
    done = v(now=5, deadline=10, healthy_since=4, stable_sec=1, dead=False)
    assert done is not None and done.outcome is Outcome.DONE
    late = v(now=10, deadline=10, healthy_since=None, stable_sec=1, dead=False)
    assert late is not None and late.outcome is Outcome.FAILED
    dead = v(now=5, deadline=10, healthy_since=4, stable_sec=1, dead=True)
    assert dead is not None and dead.outcome is Outcome.FAILED


AWAIT = FaultToleranceConfig(enable_fault_tolerance=True, await_recovery_timeout_sec=0.5, await_recovery_stable_sec=0.1)


async def test_await_recovery_is_done_when_healthy_for_the_stable_window() -> None:
    seen = iter([True, False, True, True, True, True, True, True, True, True] + [True] * 100)
    s = AwaitRecovery(AWAIT, Progress(), healthy=lambda _: next(seen), deleted=lambda _: False, poll_interval=0.02)
    result = await s.run(managed(IID))
    assert result.outcome is Outcome.DONE and s.progress.phase == "done"


async def test_await_recovery_fails_at_the_deadline_when_never_healthy() -> None:
    s = AwaitRecovery(AWAIT, Progress(), healthy=lambda _: False, deleted=lambda _: False, poll_interval=0.02)
    result = await s.run(managed(IID))
    assert result.outcome is Outcome.FAILED and s.progress.phase == "expired"


async def test_await_recovery_stops_when_the_instance_is_deleted() -> None:
    s = AwaitRecovery(AWAIT, Progress(), healthy=lambda _: False, deleted=lambda _: True, poll_interval=0.02)
    assert (await s.run(managed(IID))).outcome is Outcome.ABORTED
