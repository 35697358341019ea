"""Container snapshot mode: strict metadata, steady-point readiness, heartbeats paused during the
checkpoint, and after the restore: re-registration, RESTORED, and a start command that adopts the
running engines.

Checkpoint/restore is emulated without CRIU: SIGUSR1 (checkpoint), then SIGSTOP of the nodemanager and
its engines (the freeze), SIGCONT, then SIGUSR2 (restored) — the signals a checkpoint tool sends.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import psutil
import pytest

from motor_common.errors import ConfigError
from motor_common.gen.motor.controller.v1 import controller_pb2 as cpb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as pb
from motor_common.grpc_server import GrpcServer
from motor_nodemanager.snapshot import SnapshotMetadata, load_metadata, parse_metadata
from tests.helpers import wait_for
from tests.nodemanager.conftest import Admin, code_of, nm_config
from tests.nodemanager.fake_controller import FakeController
from tests.nodemanager.test_nodemanager_process import all_normal, exited, registered, start_request
from tests.procs import start_nodemanager

Ctl = tuple[GrpcServer, FakeController]


# --- metadata ---------------------------------------------------------------------------------------
def test_metadata_accepts_the_three_string_fields_all_optional() -> None:
    full = {"model_load_path": "/models/q", "job_name": "job-b", "namespace": "ns"}
    assert parse_metadata(full) == SnapshotMetadata("/models/q", "job-b", "ns")
    assert parse_metadata({}) == SnapshotMetadata()


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        ({"job_name": "a", "jobname": "b"}, "unknown key(s) jobname"),
        ({"job_name": 3}, "values must be strings: job_name=3"),
        ({"namespace": None}, "values must be strings: namespace=None"),
        (["job_name"], "must be a JSON object"),
    ],
)
def test_metadata_rejects_unknown_keys_and_non_string_values(raw: object, text: str) -> None:
    with pytest.raises(ConfigError, match="snapshot metadata") as err:
        parse_metadata(raw)
    assert text in err.value.message


def test_metadata_file_must_be_set_readable_and_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="metadata_path must be set"):
        load_metadata(None)
    with pytest.raises(ConfigError, match="cannot read"):
        load_metadata(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_metadata(str(bad))


def snapshot_cfg(port: int, key_file: str, tmp_path: Path, meta: dict[str, object]) -> dict[str, object]:
    path = tmp_path / "snapshot_metadata.json"
    path.write_text(json.dumps(meta))
    return nm_config(port, key_file, tmp_path, snapshot_config={"enable_snapshot": True, "metadata_path": str(path)})


async def test_invalid_snapshot_metadata_is_a_start_up_error(tmp_path: Path, key_file: str) -> None:
    cfg = snapshot_cfg(1, key_file, tmp_path, {"job_name": "job-a", "extra": "x"})
    nm = await start_nodemanager(tmp_path, cfg, wait_ready=False)
    assert await exited(nm, 15) == 2
    assert "unknown key(s) extra" in nm.log_text()


# --- checkpoint / restore, emulated -----------------------------------------------------------------
def _signal_tree(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _engine_family(nm_pid: int) -> set[int]:
    return {c.pid for c in psutil.Process(nm_pid).children(recursive=True)}


@pytest.mark.slow
async def test_checkpoint_pauses_heartbeats_and_restore_reregisters_and_adopts_the_engines(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    server, impl = controller
    cfg = snapshot_cfg(server.port, key_file, tmp_path, {"job_name": "job-a", "model_load_path": "/m"})
    nm = await start_nodemanager(tmp_path, cfg)
    admin = Admin(nm.address)
    try:
        spec = await registered(impl)
        assert "config-watcher" not in nm.log_text()
        pids = list((await admin.call("StartEngines", start_request(spec))).pids)
        await wait_for(lambda: all_normal(admin), timeout=15, what="engines NORMAL")
        ready = await admin.call("GetReadiness", pb.GetReadinessRequest())
        assert ready.ready and "steady point reached" in ready.reason
        engines = _engine_family(nm.proc.pid)
        assert set(pids) <= engines
        env = psutil.Process(pids[0]).environ()
        assert env["MOTOR_SNAPSHOT_METADATA"] == cfg["snapshot_config"]["metadata_path"]  # type: ignore[index]

        # checkpoint: heartbeats stop, readiness false
        nm.proc.send_signal(signal.SIGUSR1)
        await wait_for(lambda: "heartbeats paused" in nm.log_text(), timeout=5, what="heartbeats paused")
        ready = await admin.call("GetReadiness", pb.GetReadinessRequest())
        assert not ready.ready and "checkpoint" in ready.reason
        frames = len(impl.frames)
        # the freeze (what criu dump does to the container), then the restore
        frozen = [nm.proc.pid, *engines]
        _signal_tree(frozen, signal.SIGSTOP)
        await wait_for(lambda: all(psutil.Process(p).status() == psutil.STATUS_STOPPED for p in frozen),
                       timeout=5, what="frozen")  # fmt: skip
        assert len(impl.frames) == frames  # nothing reached the controller while checkpointing
        # the restored container gets its new job name from the metadata
        Path(cfg["snapshot_config"]["metadata_path"]).write_text(json.dumps({"job_name": "job-r"}))  # type: ignore[index]
        _signal_tree(frozen, signal.SIGCONT)
        regs = len(impl.registrations)
        nm.proc.send_signal(signal.SIGUSR2)

        await wait_for(lambda: len(impl.registrations) > regs, timeout=10, what="re-registration")
        assert impl.registrations[-1].job_name == "job-r"
        await wait_for(lambda: len(impl.frames) > frames and impl.frames[-1].state == cpb.NODE_STATE_RESTORED,
                       timeout=5, what="RESTORED heartbeat")  # fmt: skip
        st = await admin.call("GetStatus", pb.GetStatusRequest())
        assert st.state == cpb.NODE_STATE_RESTORED
        ready = await admin.call("GetReadiness", pb.GetReadinessRequest())
        assert not ready.ready and ready.reason == "restored from snapshot, waiting for a start command"
        with pytest.raises(Exception) as err:
            await admin.call("RestartEngine", pb.RestartEngineRequest(action=pb.RESTART_ACTION_RESTART))
        assert code_of(err.value) is not None and code_of(err.value).name == "ABORTED"  # type: ignore[union-attr]

        # start after restore: the same engines are adopted, nothing new is spawned
        resp = await admin.call("StartEngines", start_request(impl.registrations[-1], instance_id=77))
        assert list(resp.pids) == pids
        assert _engine_family(nm.proc.pid) == engines
        await wait_for(lambda: all_normal(admin), timeout=10, what="adopted engines NORMAL")
        ready = await admin.call("GetReadiness", pb.GetReadinessRequest())
        assert ready.ready, ready.reason
        st = await admin.call("GetStatus", pb.GetStatusRequest())
        assert (st.state, st.instance_id) == (cpb.NODE_STATE_RUNNING, 77)
        assert "engines adopted after snapshot restore" in nm.log_text()
    finally:
        _signal_tree([nm.proc.pid], signal.SIGCONT)
        await admin.close()
        assert nm.terminate() == 0


@pytest.mark.slow
async def test_start_after_restore_relaunches_when_a_restored_engine_is_gone(
    tmp_path: Path, controller: Ctl, key_file: str
) -> None:
    server, impl = controller
    nm = await start_nodemanager(tmp_path, snapshot_cfg(server.port, key_file, tmp_path, {"job_name": "job-a"}))
    admin = Admin(nm.address)
    try:
        spec = await registered(impl)
        pids = list((await admin.call("StartEngines", start_request(spec))).pids)
        await wait_for(lambda: all_normal(admin), timeout=15, what="engines NORMAL")
        nm.proc.send_signal(signal.SIGUSR1)
        await wait_for(lambda: "heartbeats paused" in nm.log_text(), timeout=5, what="heartbeats paused")
        regs = len(impl.registrations)
        nm.proc.send_signal(signal.SIGUSR2)
        await wait_for(lambda: len(impl.registrations) > regs, timeout=10, what="re-registration")
        os.killpg(pids[1], signal.SIGKILL)  # lost in the restore
        await wait_for(lambda: "engine process exited" in nm.log_text(), timeout=5, what="the node saw it go")
        resp = await admin.call("StartEngines", start_request(spec, instance_id=78))
        assert set(resp.pids).isdisjoint(pids)
        await wait_for(lambda: all_normal(admin), timeout=15, what="relaunched engines NORMAL")
        assert "cannot be adopted" in nm.log_text()
        assert gone_pid(pids[0])
    finally:
        await admin.close()
        assert nm.terminate() == 0


def gone_pid(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
