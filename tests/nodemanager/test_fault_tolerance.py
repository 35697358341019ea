"""Death signals, freeze and RestartEngine: pure/in-process parts, then the real process against a fake
controller with real motor-sim engines."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
import yaml

from motor_common.errors import Aborted, FailedPrecondition, InvalidArgument, Unavailable
from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.controller.v1 import controller_pb2 as cpb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as pb
from motor_common.grpc_server import GrpcServer
from motor_common.runner import EXIT_RESCHEDULE
from motor_nodemanager.config import FaultToleranceConfig, NodeManagerConfig
from motor_nodemanager.controller_client import FaultAck, FaultLevel, FaultReport, FaultSource
from motor_nodemanager.deaths import DeathLedger, DeathReporter
from motor_nodemanager.node import Node
from tests.helpers import wait_for
from tests.nodemanager.conftest import Admin, code_of, nm_config
from tests.nodemanager.fake_controller import FakeController
from tests.nodemanager.test_nodemanager_process import all_normal, exited, registered, start_request
from tests.procs import NodeManagerProc, start_nodemanager

Ctl = tuple[GrpcServer, FakeController]


def exit_report(pid: int, endpoint: int = 0) -> FaultReport:
    return FaultReport("n", 1, endpoint, FaultLevel.ENGINE_DEAD, FaultSource.PROCESS_EXIT, pid)


def probe_report(endpoint: int = 0) -> FaultReport:
    return FaultReport("n", 1, endpoint, FaultLevel.ENGINE_DEAD, FaultSource.HEALTH_PROBE)


# --- pure / in-process ----------------------------------------------------------------------------
def test_ledger_deduplicates_exits_by_pid_and_probe_deaths_per_endpoint_until_recovery() -> None:
    ledger = DeathLedger()
    assert ledger.claim(exit_report(100)) and not ledger.claim(exit_report(100))
    assert ledger.claim(exit_report(101))
    assert ledger.claim(probe_report(0)) and not ledger.claim(probe_report(0))
    assert ledger.claim(probe_report(1))
    ledger.recovered(0)
    assert ledger.claim(probe_report(0)) and not ledger.claim(probe_report(1))
    assert not ledger.claim(exit_report(100))  # a pid never comes back


async def test_a_failed_report_is_retried_until_accepted_and_only_then_counts() -> None:
    calls: list[FaultReport] = []
    accepted: list[FaultAck] = []
    failures = [Unavailable("down"), Unavailable("down")]

    async def send(r: FaultReport) -> FaultAck:
        calls.append(r)
        if failures:
            raise failures.pop(0)
        return FaultAck(True, True)

    rep = DeathReporter(send, lambda r, a: accepted.append(a), lambda: 0.01)
    assert not await rep.report(exit_report(7))
    assert not await rep.report(exit_report(7))  # the same pid again: suppressed, no second report
    await wait_for(lambda: accepted, timeout=2, what="accepted after retries")
    assert len(calls) == 3 and rep.pending == 0
    await rep.close()


async def test_a_report_refused_invalid_argument_is_given_up_not_retried_unchanged() -> None:
    calls: list[FaultReport] = []

    async def send(r: FaultReport) -> FaultAck:
        calls.append(r)
        raise InvalidArgument("detail is 6168 characters long; at most 4096 are allowed", reason="TOO_LONG")

    rep = DeathReporter(send, lambda r, a: None, lambda: 0.01)
    assert not await rep.report(probe_report(3))
    assert (len(calls), rep.pending, rep.refused, rep.accepted) == (1, 0, 1, 0)  # no retry task
    await rep.close()


async def test_withdrawing_a_recovered_endpoint_stops_its_retries() -> None:
    async def send(r: FaultReport) -> FaultAck:
        raise Unavailable("down")

    rep = DeathReporter(send, lambda r, a: None, lambda: 0.01)
    await rep.report(probe_report(3))
    assert rep.pending == 1
    rep.withdraw(3)
    assert rep.pending == 0
    await rep.close()


def node(**ft: object) -> tuple[Node, list[float]]:
    now = [100.0]
    cfg = NodeManagerConfig(role="prefill", fault_tolerance_config=FaultToleranceConfig(**ft))  # type: ignore[arg-type]
    return Node(lambda: cfg, (), clock=lambda: now[0]), now


def test_freeze_needs_an_accepted_death_report_with_relaunch_expected_and_the_switch_on() -> None:
    from motor_common.domain import EngineType, Role
    from motor_nodemanager.start_command import StartCommand

    cmd = StartCommand(1, "motor", Role.PREFILL, EngineType.VLLM, "m", (), 0, 1, "", 0, 1, 1, ())
    n, now = node(engine_restart_freeze_sec=10.0)
    n.command = cmd
    n.on_fault_accepted(exit_report(5), FaultAck(True, False))
    assert not n.arbiter.is_frozen(now[0])
    n.on_fault_accepted(exit_report(5), FaultAck(True, True))
    assert n.arbiter.is_frozen(now[0])
    now[0] += 10.0  # an expired freeze lifts by itself
    assert not n.arbiter.is_frozen(now[0])
    off, now2 = node(enable_engine_relaunch=False)
    off.command = cmd
    off.on_fault_accepted(exit_report(5), FaultAck(True, True))
    assert not off.arbiter.is_frozen(now2[0])


async def test_restart_engine_refuses_when_not_started_restoring_or_already_relaunching() -> None:
    from motor_common.domain import EngineType, Role
    from motor_nodemanager.start_command import StartCommand

    n, _ = node()
    with pytest.raises(FailedPrecondition):
        await n.restart_engine(abort=False, instance_id=0)
    n.restored = True
    with pytest.raises(Aborted, match="snapshot"):
        await n.restart_engine(abort=False, instance_id=0)
    n.restored = False
    n.command = StartCommand(1, "motor", Role.PREFILL, EngineType.VLLM, "m", (), 0, 1, "", 0, 1, 1, ())
    n.relaunching = True
    with pytest.raises(Aborted, match="already in progress"):
        await n.restart_engine(abort=False, instance_id=1)
    n.arbiter.freeze(1e9)
    await n.restart_engine(abort=True, instance_id=1)  # abort unfreezes
    assert n.arbiter.frozen_until is None


# --- the real process -----------------------------------------------------------------------------
@asynccontextmanager
async def started(
    tmp_path: Path, controller: Ctl, key_file: str, **over: object
) -> AsyncIterator[tuple[NodeManagerProc, Admin, list[int]]]:
    """A nodemanager with its engine NORMAL; stopped (with its admin channel) on exit, also when
    the start itself fails."""
    server, impl = controller
    over.setdefault("fault_tolerance_config", {"report_retry_interval_sec": 0.1, "report_timeout_sec": 1.0})
    cfg = nm_config(server.port, key_file, tmp_path, endpoints_per_node=1, **over)
    nm = await start_nodemanager(tmp_path, cfg)
    admin = Admin(nm.address)
    try:
        spec = await registered(impl)
        resp = await admin.call("StartEngines", start_request(spec))
        await wait_for(lambda: all_normal(admin), timeout=20, what="NORMAL")
        yield nm, admin, list(resp.pids)
    finally:
        await admin.close()
        nm.terminate()


async def frozen(admin: Admin) -> bool:
    return bool((await admin.call("GetStatus", pb.GetStatusRequest())).frozen)


async def unfrozen(admin: Admin) -> bool:
    return not await frozen(admin)


def assert_unfrozen_by_the_failed_relaunch(log: str) -> None:
    assert "engine relaunch failed: self-termination unfrozen" in log
    assert "self-termination freeze expired" not in log


@pytest.mark.slow
async def test_engine_exit_is_reported_once_retried_until_accepted_then_frozen_and_abort_unfreezes(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    _, impl = controller
    impl.relaunch_expected = True
    impl.fail_faults = 2  # the first two reports fail: retried, and nothing freezes before success
    async with started(tmp_path, controller, key_file) as (nm, admin, pids):
        os.killpg(pids[0], signal.SIGKILL)
        await wait_for(lambda: impl.faults, timeout=10, what="accepted fault report")
        await wait_for(lambda: frozen(admin), timeout=5, what="freeze")
        f = impl.faults[0]
        assert (f.level, f.source, f.pid, f.instance_id) == (
            cpb.FAULT_LEVEL_ENGINE_DEAD, cpb.FAULT_SOURCE_PROCESS_EXIT, pids[0], 42)
        n0 = len(impl.frames)  # several more heartbeats (and health probes) before counting reports
        await wait_for(lambda: len(impl.frames) > n0 + 5, timeout=5, what="more heartbeats")
        assert len(impl.faults) == 1  # one pid, one report (the health probe does not report it again)
        await admin.call("RestartEngine", pb.RestartEngineRequest(action=pb.RESTART_ACTION_ABORT))
        # unfrozen: the arbiter terminates the node at once (the freeze had 720 s left), so a
        # GetStatus read now races the node's own shutdown; its exit and its log are the proof
        assert await exited(nm, 10) == EXIT_RESCHEDULE
        log = nm.log_text()
        assert "engine relaunch aborted by the controller: self-termination unfrozen" in log
        assert "self-termination freeze expired" not in log


@pytest.mark.slow
async def test_freeze_expires_by_itself_and_self_termination_resumes(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    _, impl = controller
    impl.relaunch_expected = True
    async with started(
        tmp_path, controller, key_file,
        fault_tolerance_config={"engine_restart_freeze_sec": 1.5, "report_retry_interval_sec": 0.1},
    ) as (nm, admin, pids):  # fmt: skip
        os.killpg(pids[0], signal.SIGKILL)
        await wait_for(lambda: frozen(admin), timeout=5, what="freeze")
        assert await exited(nm, 10) == EXIT_RESCHEDULE
        assert "self-termination freeze expired" in nm.log_text()


@pytest.mark.slow
async def test_no_freeze_when_the_controller_does_not_expect_a_relaunch(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    _, impl = controller
    async with started(tmp_path, controller, key_file) as (nm, _, pids):
        os.killpg(pids[0], signal.SIGKILL)
        await wait_for(lambda: impl.faults, timeout=5, what="fault report")
        # not frozen, the arbiter terminates the node at once, so a GetStatus read now races the
        # node's own shutdown: its exit and its log are the proof that it never froze
        assert await exited(nm, 10) == EXIT_RESCHEDULE
        log = nm.log_text()
        assert "self-termination:" in log and "self-termination frozen" not in log


@pytest.mark.slow
async def test_hung_engine_is_reported_once_by_the_health_probe(tmp_path: Path, controller: Ctl, key_file: str) -> None:
    import aiohttp

    _, impl = controller
    impl.relaunch_expected = True
    async with started(tmp_path, controller, key_file) as (_, admin, pids):
        st = await admin.call("GetStatus", pb.GetStatusRequest())
        assert st.endpoints[0].pid == pids[0]
        spec = impl.registrations[-1]
        port = spec.endpoints[0].business_port
        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://127.0.0.1:{port}/sim/fault", json={"mode": "hang"}) as r:
                assert r.status == 200
        await wait_for(lambda: impl.faults, timeout=10, what="health-probe death report")
        assert impl.faults[0].source == cpb.FAULT_SOURCE_HEALTH_PROBE and impl.faults[0].pid == pids[0]
        await wait_for(lambda: frozen(admin), timeout=5, what="freeze")
        # the relaunch the controller would send: new engine, reporter state reset
        resp = await admin.call("RestartEngine", pb.RestartEngineRequest(action=pb.RESTART_ACTION_RESTART))
        assert resp.relaunch_count == 1 and resp.pids[0] != pids[0]
        assert await all_normal(admin)  # RestartEngine answers once the relaunched engines are NORMAL
        await wait_for(lambda: unfrozen(admin), timeout=5, what="unfreeze once NORMAL")
        assert len(impl.faults) == 1


@pytest.mark.slow
async def test_a_nodemanager_stalled_mid_probe_does_not_report_its_healthy_engine(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    """The engine answers /health in 0.6 s (a busy engine), within the 1 s budget; the nodemanager
    process is stopped three times for 2.5 s (starved of CPU) while its probes are in flight (0.6 s
    of every 0.65 s). Each answer waits in its socket; the budget counts only the nodemanager's
    responsive time, so no probe fails and nothing is reported (a wall-clock timeout failed the
    probe on waking, and with failure_threshold 1 reported the engine dead: a relaunch of a healthy
    engine caused by the control plane's own starvation)."""
    import aiohttp

    _, impl = controller
    impl.relaunch_expected = True
    health = {"poll_interval_sec": 0.05, "timeout_sec": 1.0, "failure_threshold": 1}
    server = {**nm_config(0, key_file, tmp_path)["server"], "metrics_port": 0}
    async with started(tmp_path, controller, key_file, health=health, server=server) as (nm, admin, pids):
        port = impl.registrations[-1].endpoints[0].business_port
        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://127.0.0.1:{port}/sim/fault", json={"mode": "slow_health", "delay_s": 0.6}) as r:
                assert r.status == 200
        for n in range(1, 4):
            os.kill(nm.proc.pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(2.5)  # the injected stall itself, not a wait for a condition
            finally:
                os.kill(nm.proc.pid, signal.SIGCONT)
            await wait_for(lambda n=n: nm.log_text().count("event loop stalled") >= n, timeout=10,
                           what=f"the nodemanager's stall {n} seen by its lag monitor")
        st = await admin.call("GetStatus", pb.GetStatusRequest())
        assert [e.status for e in st.endpoints] == [tpb.ENDPOINT_STATUS_NORMAL] and st.endpoints[0].pid == pids[0]
        assert impl.faults == [] and "/health timed out" not in nm.log_text()
        metrics_port = json.loads((tmp_path / "nm.ports.json").read_text())["metrics"]
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
            text = await r.text()
        [stalled] = [float(x.split()[1]) for x in text.splitlines() if x.startswith("motor_event_loop_stalled_seconds_total ")]
        assert stalled >= 6.0, text  # three 2.5 s stops, counted (and not counted in the probes' budget)


@pytest.mark.slow
async def test_relaunch_failure_is_internal_unfreezes_and_the_node_terminates(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    _, impl = controller
    impl.relaunch_expected = True
    async with started(tmp_path, controller, key_file) as (nm, admin, pids):
        cfg = yaml.safe_load(nm.config_path.read_text())
        cfg["engine"]["env"]["MOTOR_SIM_FAULT"] = "refuse_start"
        nm.config_path.write_text(yaml.safe_dump(cfg))
        await wait_for(lambda: "configuration reloaded" in nm.log_text(), timeout=5, what="hot reload")
        os.killpg(pids[0], signal.SIGKILL)
        await wait_for(lambda: frozen(admin), timeout=5, what="freeze")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await admin.call("RestartEngine", pb.RestartEngineRequest(action=pb.RESTART_ACTION_RESTART))
        assert code_of(err.value) == grpc.StatusCode.INTERNAL and "Failed to relaunch engine" in (err.value.details() or "")
        # unfrozen with nothing running: the arbiter terminates the node at once (the freeze had
        # 720 s left), so a GetStatus read now races the node's own shutdown; its exit and its
        # log are the proof
        assert await exited(nm, 10) == EXIT_RESCHEDULE
        assert_unfrozen_by_the_failed_relaunch(nm.log_text())




@pytest.mark.slow
async def test_a_relaunch_not_normal_within_the_wait_timeout_is_internal_and_unfreezes(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    _, impl = controller
    impl.relaunch_expected = True
    async with started(
        tmp_path, controller, key_file,
        fault_tolerance_config={"engine_restart_wait_timeout_sec": 1.0, "report_retry_interval_sec": 0.1},
    ) as (nm, admin, pids):  # fmt: skip
        cfg = yaml.safe_load(nm.config_path.read_text())
        cfg["engine"]["env"]["MOTOR_SIM_FAULT"] = "health_503"  # the relaunched engine runs but is never NORMAL
        nm.config_path.write_text(yaml.safe_dump(cfg))
        await wait_for(lambda: "configuration reloaded" in nm.log_text(), timeout=5, what="hot reload")
        os.killpg(pids[0], signal.SIGKILL)
        await wait_for(lambda: frozen(admin), timeout=5, what="freeze")
        t0 = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await admin.call("RestartEngine", pb.RestartEngineRequest(action=pb.RESTART_ACTION_RESTART))
        assert code_of(err.value) == grpc.StatusCode.INTERNAL
        assert "engine_restart_wait_timeout_sec" in (err.value.details() or "")
        assert 1.0 <= time.monotonic() - t0 < 8.0
        # nothing NORMAL runs: the arbiter restarts the node at once, so (as above) its exit and
        # its log prove the unfreeze, not a GetStatus read racing the shutdown
        assert await exited(nm, 10) == EXIT_RESCHEDULE
        assert_unfrozen_by_the_failed_relaunch(nm.log_text())


def test_a_probe_failure_is_unhealthy_not_dead_when_the_engine_publishes_its_own_faults() -> None:
    from motor_common.domain import EngineType, Role
    from motor_nodemanager import endpoint_state as es
    from motor_nodemanager.start_command import StartCommand

    n, now = node(enable_fault_tolerance=True, zmq_pub_port=41000)
    n.node_id = "n"
    n.command = StartCommand(1, "motor", Role.PREFILL, EngineType.VLLM, "m", (), 0, 1, "", 0, 1, 1, ())
    old = es.observe(es.launched(0, generation=1, now=now[0], pid=9), es.Observation.HEALTHY,
                     generation=1, now=now[0], grace_sec=0.0)  # fmt: skip
    new = es.observe(old, es.Observation.UNHEALTHY, generation=1, now=now[0], grace_sec=0.0)
    plain = n._death_of(old, new, es.Observation.UNHEALTHY, "503")
    assert plain is not None and plain.level is FaultLevel.ENGINE_DEAD  # no publisher followed: a death
    n.fault_reporter = object()  # type: ignore[assignment]
    r = n._death_of(old, new, es.Observation.UNHEALTHY, "503")
    assert r is not None and (r.level, r.source) == (FaultLevel.ENGINE_UNHEALTHY, FaultSource.HEALTH_PROBE)
    exit_ = n._death_of(old, es.observe(old, es.Observation.EXITED, generation=1, now=now[0], grace_sec=0.0),
                        es.Observation.EXITED, "exit")  # fmt: skip
    assert exit_ is not None and exit_.level is FaultLevel.ENGINE_DEAD  # a process exit stays a death
    # an accepted unhealthy report with relaunch expected freezes too (await recovery may escalate)
    n.on_fault_accepted(r, FaultAck(True, True))
    assert n.arbiter.is_frozen(now[0])


def test_default_node_id_is_stable_across_restarts() -> None:
    from motor_nodemanager.app import default_node_id

    cfg = NodeManagerConfig(role="prefill", job_name="job-x", node_rank=1, nodes_per_instance=2)
    assert default_node_id(cfg, {}, "host-a") == "host-a:job-x:1"  # no port in it
    assert default_node_id(cfg, {"POD_NAME": "pod-7"}, "host-a") == "pod-7"
    assert default_node_id(NodeManagerConfig(role="prefill", node_id="n1"), {"POD_NAME": "p"}, "h") == "n1"
