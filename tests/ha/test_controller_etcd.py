"""The controller on the etcd store, with real processes: etcd, ``motor-controller`` (store.backend
etcd, controller election), real ``motor-nodemanager`` processes launching ``motor-sim`` vLLM
engines (prefill + decode).

* kill -9 the controller and start it again: same instances, no engine relaunched (engine pids,
  relaunch counts unchanged, no StartEngines sent by the new process);
* two controllers: the standby answers NOT_SERVING and refuses mutations with UNAVAILABLE
  NOT_MASTER; kill -9 the master: the standby takes over through the election and resumes from
  etcd without relaunching anything (the nodemanagers know both addresses);
* kill etcd: the controller keeps running (same pid), stops acting, reports STORE_UNAVAILABLE
  (alarm) and engines keep serving; etcd back: it acts again with the same instances.

Run: ``.venv/bin/pytest tests/ha/test_controller_etcd.py -s`` (prints the measurements).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aetcd
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from motor_cli.status import fetch_view
from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as pbgrpc
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as npb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2_grpc as ngrpc
from motor_common.grpc_client import call_metadata, open_channel
from tests.etcd_server import EtcdServer, etcd_server
from tests.fault.fleet import nm_config
from tests.helpers import free_port, wait_for
from tests.procs import NodeManagerProc, Proc, start_controller, start_nodemanager

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.timeout(90)]

KEY = "ha-controller-key"
JOBS = {"job-p": "prefill", "job-d": "decode"}


def controller_config(etcd: EtcdServer, port: int) -> dict[str, Any]:
    return {
        "server": {"host": "127.0.0.1", "port": port, "grace_seconds": 0.2},
        "heartbeat_interval_sec": 0.2,
        # a takeover (lease TTL) plus the nodemanagers' heartbeat reconnect back-off (0.25 s doubling,
        # capped at 5 s; measured ~5.7 s after the new master acts) must not read as a node loss
        "heartbeat_timeout_sec": 10.0,
        "reconcile_interval_sec": 0.2,
        "rpc_timeout_sec": 2.0,
        "start_retry_interval_sec": 1.0,
        "store": {"backend": "etcd", "etcd_endpoints": [etcd.endpoint], "etcd_prefix": "/motor/t/controller/",
                  "etcd_timeout_sec": 1.0},
        "ha": {"election_key": "/motor/t/controller-leader", "lock_ttl_sec": 2, "check_interval_sec": 0.25},
    }


@dataclass
class World:
    tmp: Path
    etcd: EtcdServer
    ports: list[int]
    nodes: dict[str, NodeManagerProc] = field(default_factory=dict)
    channels: dict[str, grpc.aio.Channel] = field(default_factory=dict)

    def channel(self, address: str) -> grpc.aio.Channel:
        if address not in self.channels:
            self.channels[address] = open_channel(address)
        return self.channels[address]

    def address(self, i: int) -> str:
        return f"127.0.0.1:{self.ports[i]}"

    async def instances(self, address: str) -> dict[str, tuple[int, int]]:
        """job -> (instance id, state) of the live instances, as *address* sees them."""
        resp = await pbgrpc.ControllerAdminServiceStub(self.channel(address)).ListInstances(
            pb.ListInstancesRequest(), metadata=call_metadata(KEY), timeout=1)
        return {m.instance.job_name: (m.instance.id, m.state) for m in resp.instances if m.state != pb.INSTANCE_STATE_DELETED}

    async def all_active(self, address: str) -> dict[str, int]:
        view = await self.instances(address)
        ok = set(view) == set(JOBS) and all(s == pb.INSTANCE_STATE_ACTIVE for _, s in view.values())
        return {j: i for j, (i, _) in view.items()} if ok else {}

    async def heartbeating(self, address: str) -> bool:
        """Every node RUNNING in *address*'s view (its heartbeats reach that controller)."""
        resp = await pbgrpc.ControllerAdminServiceStub(self.channel(address)).ListNodes(
            pb.ListNodesRequest(), metadata=call_metadata(KEY), timeout=1)
        return len(resp.nodes) == len(JOBS) and all(n.state == pb.NODE_STATE_RUNNING for n in resp.nodes)

    async def engines(self) -> dict[str, tuple[list[int], int]]:
        """node -> (engine pids, relaunch count)."""
        out = {}
        for name, nm in self.nodes.items():
            st = await ngrpc.NodeManagerServiceStub(self.channel(nm.address)).GetStatus(
                npb.GetStatusRequest(), metadata=call_metadata(KEY), timeout=1)
            out[name] = ([e.pid for e in st.endpoints], int(st.relaunch_count))
        return out

    async def serving(self, address: str) -> bool:
        try:
            resp = await health_pb2_grpc.HealthStub(self.channel(address)).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=0.5)
        except grpc.aio.AioRpcError:
            return False
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)

    async def alarms(self, address: str) -> list[pb.Alarm]:
        resp = await pbgrpc.ControllerAdminServiceStub(self.channel(address)).ListAlarms(
            pb.ListAlarmsRequest(active_only=True), metadata=call_metadata(KEY), timeout=1)
        return list(resp.alarms)


def controller(w: World, i: int, name: str) -> Any:
    return start_controller(w.tmp, controller_config(w.etcd, w.ports[i]), management_key=KEY, name=name)


@asynccontextmanager
async def world(tmp: Path, controllers: int) -> AsyncIterator[World]:
    key_file = tmp / "fleet.key"
    key_file.write_text(KEY + "\n")
    async with etcd_server() as etcd:
        w = World(tmp, etcd, [free_port() for _ in range(controllers)])
        try:
            yield w
        finally:
            for ch in w.channels.values():
                await ch.close()
            for nm in w.nodes.values():
                await asyncio.to_thread(nm.terminate)


async def start_nodes(w: World) -> None:
    addresses = ",".join(w.address(i) for i in range(len(w.ports)))
    for job, role in JOBS.items():
        cfg = nm_config(addresses, str(w.tmp / "fleet.key"), w.tmp, job, role)
        w.nodes[job] = await start_nodemanager(w.tmp, cfg, name=job)


def starts_sent(proc: Proc) -> int:
    return proc.log().count("start command sent")


async def test_restarted_controller_on_etcd_resumes_without_relaunching_engines(tmp_path: Path) -> None:
    async with world(tmp_path, 1) as w:
        async with controller(w, 0, "ctl-1") as first:
            await start_nodes(w)
            ids = await wait_for(lambda: w.all_active(first.address), timeout=30, what="both instances ACTIVE")
            engines = await w.engines()
            assert starts_sent(first) == 2
            first.kill(signal.SIGKILL)
        t0 = time.monotonic()
        async with controller(w, 0, "ctl-2") as second:
            assert await wait_for(lambda: w.all_active(second.address), timeout=20, what="ACTIVE after restart") == ids
            await wait_for(lambda: w.heartbeating(second.address), timeout=15, what="heartbeats on the new process")
            print(f"\n[etcd restart] kill -9 -> new process has the same ACTIVE instances and every node's"
                  f" heartbeat {time.monotonic() - t0:.2f}s")
            assert await w.engines() == engines  # same engine pids, no relaunch
            assert starts_sent(second) == 0


async def test_standby_controller_refuses_then_takes_over_from_etcd_without_relaunching(tmp_path: Path) -> None:
    async with world(tmp_path, 2) as w, AsyncExitStack() as es:
        procs = [await es.enter_async_context(controller(w, i, f"ctl-{i}")) for i in range(2)]
        master = await wait_for(lambda: _serving_one(w, procs), timeout=15, what="one serving controller")
        assert master is not None
        standby = next(p for p in procs if p is not master)
        await start_nodes(w)
        ids = await wait_for(lambda: w.all_active(master.address), timeout=30, what="both instances ACTIVE")
        engines = await w.engines()

        assert not await w.serving(standby.address)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pbgrpc.ControllerAdminServiceStub(w.channel(standby.address)).TerminateInstance(
                pb.TerminateInstanceRequest(instance_id=ids["job-p"]), metadata=call_metadata(KEY), timeout=1)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "controller is not master" in (err.value.details() or "")

        master.kill(signal.SIGKILL)
        t0 = time.monotonic()
        await wait_for(lambda: w.serving(standby.address), timeout=10, interval=0.05, what="the standby to act")
        t_master = time.monotonic() - t0
        assert await wait_for(lambda: w.all_active(standby.address), timeout=15, what="ACTIVE on the new master") == ids
        await wait_for(lambda: w.heartbeating(standby.address), timeout=15, what="heartbeats on the new master")
        t_active = time.monotonic() - t0
        print(f"\n[controller takeover] kill -9 master -> standby acting {t_master:.2f}s, instances ACTIVE + heartbeats {t_active:.2f}s")
        assert await w.engines() == engines
        assert starts_sent(standby) == 0


async def test_etcd_down_controller_holds_reports_store_unavailable_and_recovers(tmp_path: Path) -> None:
    async with world(tmp_path, 1) as w, controller(w, 0, "ctl") as ctl:
        await start_nodes(w)
        ids = await wait_for(lambda: w.all_active(ctl.address), timeout=30, what="both instances ACTIVE")
        engines = await w.engines()

        w.etcd.kill()
        t0 = time.monotonic()
        alarms = await wait_for(lambda: _store_alarm(w, ctl.address), timeout=10, what="STORE_UNAVAILABLE alarm")
        print(f"\n[etcd down] STORE_UNAVAILABLE raised after {time.monotonic() - t0:.2f}s: {alarms[0].message}")
        assert not await w.serving(ctl.address)
        await wait_for(lambda: "controller stopped acting" in ctl.log(), timeout=5, what="stopped acting")
        down_for = time.monotonic()
        await wait_for(lambda: time.monotonic() - down_for > 3 and ctl.alive(), timeout=10, what="3 s of outage")
        assert ctl.alive() and await w.engines() == engines

        w.etcd.start()  # same data dir and ports
        await w.etcd.wait_healthy()
        t1 = time.monotonic()
        await wait_for(lambda: w.serving(ctl.address), timeout=15, interval=0.05, what="acting again")
        assert await wait_for(lambda: w.all_active(ctl.address), timeout=15, what="ACTIVE after etcd is back") == ids
        await wait_for(lambda: w.heartbeating(ctl.address), timeout=15, what="heartbeats after etcd is back")
        print(f"[etcd back] controller acting again after {time.monotonic() - t1:.2f}s, same instances, same engines")
        assert not await _store_alarm(w, ctl.address)
        assert await w.engines() == engines and ctl.alive()
        assert ctl.log().count("motor-controller ready") == 1  # never restarted


async def test_a_controller_that_cannot_read_its_state_hands_the_lock_over_and_acts_once_repaired(tmp_path: Path) -> None:
    """An instance record this version cannot decode: the elected controller does not act, raises
    STATE_LOAD_FAILED naming the key, says why in its readiness log, and revokes its lease (the
    lock key is gone, so another candidate could take over) instead of holding the lock while
    never acting; once the record is deleted it acts, and the alarm is gone."""
    bad = "/motor/t/controller/instances/6"
    async with world(tmp_path, 1) as w:
        async with aetcd.Client(host="127.0.0.1", port=w.etcd.client_port, timeout=2) as raw:
            await raw.put(bad.encode(), b'{"id": 6, "state": "draining"}')

            async def lock_free() -> bool:
                return await raw.get(b"/motor/t/controller-leader") is None

            async with controller(w, 0, "ctl") as ctl:
                alarms = await wait_for(lambda: _alarms_of(w, ctl.address, pb.ALARM_KIND_STATE_LOAD_FAILED),
                                        timeout=15, what="STATE_LOAD_FAILED alarm")
                assert "'instances/6'" in alarms[0].message and alarms[0].source.startswith("controller@")
                assert not await w.serving(ctl.address)
                view = await fetch_view(ctl.address, KEY)  # what `motor status` prints first
                assert view.isolation.startswith("controller NOT ACTING: its state cannot be loaded (")
                assert "'instances/6'" in view.isolation
                await wait_for(lambda: "handing the lock to another candidate" in ctl.log(), timeout=5,
                               what="the step-down logged")
                await wait_for(lock_free, timeout=5, interval=0.05, what="the lock released")
                assert "state load failed" in ctl.log()  # holding back from the free lock, and why

                await raw.delete(bad.encode())
                await wait_for(lambda: w.serving(ctl.address), timeout=30, interval=0.1, what="acting once repaired")
                assert not await _alarms_of(w, ctl.address, pb.ALARM_KIND_STATE_LOAD_FAILED)
                assert ctl.alive() and ctl.log().count("motor-controller ready") == 1


async def _alarms_of(w: World, address: str, kind: int) -> list[pb.Alarm]:
    return [a for a in await w.alarms(address) if a.kind == kind]


async def _serving_one(w: World, procs: list[Proc]) -> Proc | None:
    serving = [p for p in procs if await w.serving(p.address)]
    return serving[0] if len(serving) == 1 else None


async def _store_alarm(w: World, address: str) -> list[pb.Alarm]:
    return [a for a in await w.alarms(address) if a.kind == pb.ALARM_KIND_STORE_UNAVAILABLE]

