"""The real motor-nodemanager process against an in-process fake controller, launching real
simulator engines (motor-sim)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path

import aiohttp
import grpc
import psutil
import pytest
import yaml

from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.controller.v1 import controller_pb2 as cpb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as pb
from motor_common.grpc_server import GrpcServer
from motor_common.runner import EXIT_RESCHEDULE
from tests.helpers import wait_for
from tests.nodemanager.conftest import Admin, nm_config
from tests.nodemanager.fake_controller import FakeController, serve_fake_controller
from tests.procs import NodeManagerProc, start_nodemanager

Ctl = tuple[GrpcServer, FakeController]


def start_request(spec: cpb.NodeSpec, **over: object) -> pb.StartEnginesRequest:
    req = pb.StartEnginesRequest(
        instance_id=42,
        job_name=spec.job_name,
        role=spec.role,
        engine_type=spec.engine_type,
        model_name=spec.model_name,
        endpoints=list(spec.endpoints),
        dp_size=len(spec.endpoints),
        generation=1,
    )
    for k, v in over.items():
        if k == "endpoints":
            del req.endpoints[:]
            req.endpoints.extend(v)  # type: ignore[arg-type]
        else:
            setattr(req, k, v)
    return req


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def family(pids: list[int]) -> list[int]:
    out = list(pids)
    for pid in pids:
        try:
            out += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return out


async def exited(nm: NodeManagerProc, timeout: float) -> int:
    await wait_for(lambda: nm.proc.poll() is not None, timeout=timeout, what="nodemanager exit")
    return int(nm.proc.returncode)


async def all_normal(admin: Admin) -> bool:
    st = await admin.call("GetStatus", pb.GetStatusRequest())
    return bool(st.endpoints) and all(e.status == tpb.ENDPOINT_STATUS_NORMAL for e in st.endpoints)


async def registered(impl: FakeController) -> cpb.NodeSpec:
    await wait_for(lambda: impl.registrations, timeout=15, what="registration")
    return impl.registrations[-1]


async def test_registers_streams_heartbeats_and_hot_reloads_the_interval(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    server, impl = controller
    cfg = nm_config(server.port, key_file, tmp_path)
    nm = await start_nodemanager(tmp_path, cfg)
    try:
        spec = await registered(impl)
        assert (spec.job_name, spec.role, spec.ip, spec.admin_port) == ("job-a", tpb.ROLE_PREFILL, "127.0.0.1", nm.port)
        assert len(spec.endpoints) == 2 and all(e.kv_port for e in spec.endpoints)
        assert spec.capabilities.engine_relaunch
        await wait_for(lambda: len(impl.frames) >= 3, timeout=10, what="heartbeat frames")
        frame = impl.frames[-1]
        assert frame.node_id == spec.node_id and frame.state == cpb.NODE_STATE_REGISTERED
        assert [f.sequence for f in impl.frames[:3]] == [1, 2, 3]
        # hot reload: heartbeat interval applied without restart, server change only logged
        cfg["heartbeat_interval_seconds"] = 30.0
        cfg["server"] = {**cfg["server"], "port": 1}
        nm.config_path.write_text(yaml.safe_dump(cfg))
        await wait_for(lambda: "configuration reloaded" in nm.log_text(), timeout=10, what="reload")
        assert "needs a restart" in nm.log_text()
        await asyncio.sleep(0.5)  # let an in-flight frame land
        count = len(impl.frames)
        await asyncio.sleep(1.0)  # at 0.2 s there would be ~5 more frames
        assert len(impl.frames) <= count + 1
    finally:
        assert nm.terminate() == 0


async def test_bad_start_commands_are_rejected_and_change_nothing_and_launch_failure_is_internal(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    server, impl = controller
    cfg = nm_config(server.port, key_file, tmp_path, engine={"command": ["/nonexistent/engine-binary"]})
    nm = await start_nodemanager(tmp_path, cfg)
    admin = Admin(nm.address)
    try:
        spec = await registered(impl)
        other_ip = [pb.StartEnginesRequest().endpoints.add(id=e.id, ip="10.1.2.3", business_port=e.business_port)
                    for e in spec.endpoints]  # fmt: skip
        low_port = [pb.StartEnginesRequest().endpoints.add(id=e.id, ip=e.ip, business_port=80) for e in spec.endpoints]
        cases = [
            (start_request(spec, job_name=""), grpc.StatusCode.INVALID_ARGUMENT, "missing job_name"),
            (start_request(spec, role=tpb.ROLE_UNSPECIFIED), grpc.StatusCode.INVALID_ARGUMENT, "role"),
            (start_request(spec, job_name="job-b"), grpc.StatusCode.FAILED_PRECONDITION, "job name"),
            (start_request(spec, endpoints=list(spec.endpoints)[:1]), grpc.StatusCode.FAILED_PRECONDITION, "endpoints"),
            (start_request(spec, endpoints=other_ip), grpc.StatusCode.FAILED_PRECONDITION, "node ip"),
            (start_request(spec, endpoints=low_port), grpc.StatusCode.FAILED_PRECONDITION, "[1024, 65535]"),
            (start_request(spec), grpc.StatusCode.INTERNAL, "Failed to start engine"),
        ]
        for req, code, text in cases:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await admin.call("StartEngines", req)
            assert err.value.code() == code, (text, err.value.details())
            assert text in (err.value.details() or ""), (text, err.value.details())
            if code == grpc.StatusCode.FAILED_PRECONDITION:
                assert (err.value.details() or "").startswith("Start command validation failed: ")
            st = await admin.call("GetStatus", pb.GetStatusRequest())
            assert (st.state, st.instance_id, len(st.endpoints)) == (cpb.NODE_STATE_REGISTERED, 0, 0)
        ready = await admin.call("GetReadiness", pb.GetReadinessRequest())
        assert not ready.ready and "no endpoints" in ready.reason
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await admin.call("RestartEngine", pb.RestartEngineRequest(action=pb.RESTART_ACTION_RESTART))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await Admin(nm.address).stub.GetStatus(pb.GetStatusRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await admin.close()
        assert nm.terminate() == 0


@pytest.mark.slow
async def test_start_pause_restart_and_stop_node_leave_no_process_behind(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    server, impl = controller
    nm = await start_nodemanager(tmp_path, nm_config(server.port, key_file, tmp_path))
    admin = Admin(nm.address)
    try:
        spec = await registered(impl)
        resp = await admin.call("StartEngines", start_request(spec))
        pids = list(resp.pids)
        assert len(pids) == 2
        await wait_for(lambda: all_normal(admin), timeout=20, what="engines NORMAL")
        async with aiohttp.ClientSession() as http:
            for e in spec.endpoints:
                async with http.get(f"http://127.0.0.1:{e.business_port}/health") as r:
                    assert r.status == 200
        ready = await admin.call("GetReadiness", pb.GetReadinessRequest())
        assert ready.ready, ready.reason
        await wait_for(lambda: impl.frames[-1].state == cpb.NODE_STATE_RUNNING, timeout=5, what="RUNNING frame")
        frame = impl.frames[-1]
        assert frame.instance_id == 42
        assert [(e.status, e.pid, e.was_normal) for e in frame.endpoints] == [
            (tpb.ENDPOINT_STATUS_NORMAL, pid, True) for pid in pids
        ]
        # identical repeat: no-op; a different one while running: rejected
        again = await admin.call("StartEngines", start_request(spec, generation=2))
        assert list(again.pids) == pids
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await admin.call("StartEngines", start_request(spec, instance_id=43))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        # pause is sticky, resume restores
        await admin.call("PauseNode", pb.PauseNodeRequest())
        await asyncio.sleep(0.3)  # several polls happen meanwhile
        st = await admin.call("GetStatus", pb.GetStatusRequest())
        assert st.state == cpb.NODE_STATE_PAUSED
        assert all(e.status == tpb.ENDPOINT_STATUS_PAUSED for e in st.endpoints)
        assert not (await admin.call("GetReadiness", pb.GetReadinessRequest())).ready
        await admin.call("ResumeNode", pb.ResumeNodeRequest())
        await wait_for(lambda: all_normal(admin), timeout=5, what="NORMAL after resume")
        # relaunch in place: new processes, banner, concurrent restart aborted
        old_family = family(pids)
        first = asyncio.ensure_future(admin.call("RestartEngine", pb.RestartEngineRequest(action=pb.RESTART_ACTION_RESTART)))
        await wait_for(lambda: "RELAUNCHING" in str(impl.frames[-1]) or first.done(), timeout=5, what="relaunch start")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await admin.call("RestartEngine", pb.RestartEngineRequest(action=pb.RESTART_ACTION_RESTART))
        assert err.value.code() == grpc.StatusCode.ABORTED
        restarted = await first
        assert restarted.relaunch_count == 1 and set(restarted.pids).isdisjoint(pids)
        assert all(gone(p) for p in old_family)
        assert "[ENGINE RELAUNCH #1]" in nm.log_text()
        await wait_for(lambda: all_normal(admin), timeout=20, what="NORMAL after relaunch")
        # StopNode: engines gone, process exits with the reschedule code, ports free
        engines = family(list(restarted.pids))
        await admin.call("StopNode", pb.StopNodeRequest(reason="test"))
        # the answer arrived, so the process answered before it terminated itself; it exits
        # stop_exit_delay_sec (0.1 s) later, which a loaded box can let pass before the next line
        # runs, so its liveness now is no invariant: its exit code and its log are
        assert all(gone(p) for p in engines)  # engines stopped before the answer (seed order)
        assert await exited(nm, 20) == EXIT_RESCHEDULE
        log = nm.log_text()
        answered = log.index("management NodeManagerService/StopNode")
        assert log.index("StopNode: engines stopped, exiting in") < answered < log.index("exiting: StopNode: test")
        assert all(port_free(e.business_port) for e in spec.endpoints)
    finally:
        await admin.close()
        nm.terminate()


@pytest.mark.slow
async def test_killed_engine_goes_abnormal_and_node_self_terminates_without_orphans(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    server, impl = controller
    nm = await start_nodemanager(tmp_path, nm_config(server.port, key_file, tmp_path))
    admin = Admin(nm.address)
    try:
        spec = await registered(impl)
        pids = list((await admin.call("StartEngines", start_request(spec))).pids)
        await wait_for(lambda: all_normal(admin), timeout=20, what="engines NORMAL")
        engines = family(pids)
        os.kill(pids[0], signal.SIGKILL)

        def abnormal_frame() -> bool:
            f = impl.last_frame()
            return f is not None and f.endpoints[0].status == tpb.ENDPOINT_STATUS_ABNORMAL

        await wait_for(abnormal_frame, timeout=10, what="ABNORMAL heartbeat")
        assert await exited(nm, 20) == EXIT_RESCHEDULE
        assert "self-termination" in nm.log_text()
        assert all(gone(p) for p in engines)
        assert all(port_free(e.business_port) for e in spec.endpoints)
    finally:
        await admin.close()
        nm.terminate()


@pytest.mark.slow
async def test_heartbeat_stream_survives_a_controller_restart_on_the_same_port(tmp_path: Path, key_file: str) -> None:
    from tests.nodemanager.conftest import KEY

    server, impl = await serve_fake_controller(key=KEY)
    port = server.port
    nm = await start_nodemanager(tmp_path, nm_config(port, key_file, tmp_path))
    try:
        await registered(impl)
        await wait_for(lambda: len(impl.frames) >= 2, timeout=10, what="frames")
        await server.stop(0)
        impl2 = FakeController()
        impl2.reregister_once = True
        server, _ = await serve_fake_controller(port=port, key=KEY, impl=impl2)
        await wait_for(lambda: len(impl2.frames) >= 3, timeout=20, what="frames after controller restart")
        await registered(impl2)  # asked to re-register by the new controller
        assert nm.proc.poll() is None
    finally:
        assert nm.terminate() == 0
        await server.stop(0)


async def test_registration_failure_terminates_with_the_reschedule_code(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    server, impl = controller
    impl.fail_registrations = 100
    nm = await start_nodemanager(tmp_path, nm_config(server.port, key_file, tmp_path))
    assert await exited(nm, 15) == EXIT_RESCHEDULE
    assert "Registration failed after maximum retries (3)" in nm.log_text()


async def test_unknown_config_key_exits_2_naming_it(tmp_path: Path, key_file: str) -> None:
    cfg = nm_config(1, key_file, tmp_path, heartbeat_interval=1)
    nm = await start_nodemanager(tmp_path, cfg, wait_ready=False)
    assert await exited(nm, 15) == 2
    assert "heartbeat_interval" in nm.log_text()


@pytest.mark.slow
async def test_stop_escalates_to_sigkill_on_an_engine_that_ignores_sigterm_within_the_stop_timeout(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    server, impl = controller
    cfg = nm_config(server.port, key_file, tmp_path,
                    engine={"env": {"MOTOR_SIM_ZERO_LATENCY": "1", "MOTOR_SIM_IGNORE_SIGTERM": "1"},
                            "stop_timeout_sec": 2.0})
    nm = await start_nodemanager(tmp_path, cfg)
    admin = Admin(nm.address)
    try:
        spec = await registered(impl)
        pids = list((await admin.call("StartEngines", start_request(spec))).pids)
        await wait_for(lambda: all_normal(admin), timeout=20, what="engines NORMAL")
        engines = family(pids)
        os.kill(pids[0], signal.SIGTERM)  # really ignored: the engine keeps serving
        await wait_for(lambda: all_normal(admin), timeout=5, what="engine still NORMAL after SIGTERM")
        assert not gone(pids[0])
        nm.proc.send_signal(signal.SIGTERM)  # stop the node: SIGTERM, then SIGKILL after 2 s
        assert await exited(nm, 15) == 0
        assert all(gone(p) for p in engines), [p for p in engines if not gone(p)]
        assert "still running after SIGTERM and the stop timeout: SIGKILL" in nm.log_text()
        assert all(port_free(e.business_port) for e in spec.endpoints)
    finally:
        await admin.close()
        nm.terminate()
