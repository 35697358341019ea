"""Precision alarms end to end with real processes (SPEC §3.5): a decode simulator that answers
wrong raises an alarm for its P/D group at the controller; the three clear paths each record a
CLEAR with the identity of the raise."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from motor_common.domain import Endpoint, EngineType, Instance, InstanceStatus, Role
from motor_common.gen.motor.controller.v1 import controller_pb2 as cpb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as cgrpc
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as kpb
from motor_common.grpc_client import call_metadata, open_channel
from tests.coordinator.grpc_util import KEY, Stubs
from tests.fault.fleet import KEY as FLEET_KEY
from tests.fault.fleet import Fleet, fleet
from tests.helpers import free_port, wait_for
from tests.procs import Proc, start_controller, start_coordinator, start_simulator

pytestmark = pytest.mark.slow

MODEL = "sim-model"
INTERVAL = 0.2
THRESHOLD = 3


def precision_config(**over: Any) -> dict[str, Any]:
    return {
        "server": {"metrics_port": 0},
        "dispatch": {"health_probe_interval_sec": 0.2, "metrics_scrape_interval_sec": 0.5,
                     "circuit_breaker_cooldown_sec": 0.2, "connect_timeout_sec": 1.0},
        "precision_clear_threshold": THRESHOLD,
        "precision": {"enabled": True, "interval_sec": INTERVAL, "timeout_sec": 2.0, "max_tokens": 8,
                      "report_retry_interval_sec": 0.2,
                      "prompts": [{"prompt": "The capital of France is"},
                                  {"messages": [{"role": "user", "content": "Say hello"}]}]},
        **over,
    }  # fmt: skip


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=orjson.dumps(body), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return dict(json.loads(resp.read()))


def set_fault(port: int, mode: str) -> None:
    post(f"http://127.0.0.1:{port}/sim/fault", {"mode": mode})


def gauges(coordinator: Proc) -> dict[str, float]:
    """``motor_coordinator_precision_alarm`` by group label, from the coordinator's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{coordinator.ports['metrics']}/metrics", timeout=2) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith('motor_coordinator_precision_alarm{group="'):
            label = line.split('"')[1]
            out[label] = float(line.rsplit(" ", 1)[1])
    return out


def clear_calls(coordinator: Proc) -> float:
    """``ClearPrecisionAlarms`` calls the coordinator answered OK (its per-RPC counter)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{coordinator.ports['metrics']}/metrics", timeout=2) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("motor_grpc_server_handled_total{") and 'method="ClearPrecisionAlarms"' in line
               and 'code="OK"' in line)  # fmt: skip


class Alarms:
    def __init__(self, controller: Proc, key: str = KEY) -> None:
        self.key = key
        self.channel = open_channel(controller.address)
        self.stub = cgrpc.ControllerAdminServiceStub(self.channel)

    async def list(self, active_only: bool = False) -> list[cpb.Alarm]:
        resp = await self.stub.ListAlarms(cpb.ListAlarmsRequest(active_only=active_only),
                                          metadata=call_metadata(self.key), timeout=2)  # fmt: skip
        return [a for a in resp.alarms if a.kind == cpb.ALARM_KIND_PRECISION]

    async def active(self, ids: list[int]) -> cpb.Alarm | None:
        return next((a for a in await self.list(True) if sorted(a.instance_ids) == ids), None)

    async def cleared(self, ids: list[int]) -> cpb.Alarm | None:
        return next((a for a in await self.list() if a.action == cpb.ALARM_ACTION_CLEAR
                     and sorted(a.instance_ids) == ids), None)  # fmt: skip

    async def close(self) -> None:
        await self.channel.close()


def identity(a: cpb.Alarm) -> tuple[int, str, list[int]]:
    return a.kind, a.source, sorted(a.instance_ids)


# -- path (3): threshold of consecutive normal samples ---------------------------------------------
@dataclass
class Standalone:
    p: Proc
    d: Proc
    coordinator: Proc
    controller: Proc


@asynccontextmanager
async def standalone(tmp_path: Path) -> AsyncIterator[Standalone]:
    """P and D simulators registered straight into a coordinator that reports to a controller
    (which pushes nothing to it: ``coordinators: []``)."""
    cport = free_port()
    async with AsyncExitStack() as es:
        p = await es.enter_async_context(start_simulator("vllm", "prefill", tmp_path, env={"MOTOR_SIM_ZERO_LATENCY": "1"}))
        d = await es.enter_async_context(start_simulator("vllm", "decode", tmp_path, env={"MOTOR_SIM_ZERO_LATENCY": "1"}))
        controller = await es.enter_async_context(start_controller(
            tmp_path, {"server": {"host": "127.0.0.1", "port": cport}, "coordinators": []}, management_key=KEY))
        coordinator = await es.enter_async_context(start_coordinator(
            tmp_path, precision_config(controller_address=controller.address), management_key=KEY))
        yield Standalone(p, d, coordinator, controller)


def inst(iid: int, role: Role, sim: Proc) -> Instance:
    return Instance(iid, role, f"job-{iid}", MODEL, EngineType.VLLM, (Endpoint(0, "127.0.0.1", sim.port),),
                    InstanceStatus.AVAILABLE)


async def test_wrong_decode_answers_raise_a_precision_alarm_and_threshold_normal_samples_clear_it(
    tmp_path: Path,
) -> None:
    async with standalone(tmp_path) as s:
        stubs, alarms = Stubs(s.coordinator.address), Alarms(s.controller)
        try:
            await stubs.set(inst(1, Role.PREFILL, s.p), inst(2, Role.DECODE, s.d))
            # First rounds learn the expected answers, then the group is sampled normal.
            await wait_for(lambda: gauges(s.coordinator).get("1-2") == 0.0, timeout=5, what="group 1-2 sampled")

            t0 = time.monotonic()
            set_fault(s.d.port, "wrong_answers")
            raised = await wait_for(lambda: alarms.active([1, 2]), timeout=5, what="precision alarm RAISE")
            t_raise = time.monotonic() - t0
            assert raised.source == f"coordinator@{s.coordinator.address}"
            assert raised.address == s.coordinator.address
            assert gauges(s.coordinator)["1-2"] == 1.0
            # Readiness is not affected; with no other group the alarmed pair keeps serving.
            assert (await stubs.readiness()).ready
            resp = post(f"{s.d.url}/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2})
            assert resp["choices"]

            t1 = time.monotonic()
            set_fault(s.d.port, "none")
            cleared = await wait_for(lambda: alarms.cleared([1, 2]), timeout=5, what="precision alarm CLEAR")
            t_clear = time.monotonic() - t1
            assert identity(cleared) == identity(raised)
            assert not await alarms.active([1, 2])
            assert gauges(s.coordinator)["1-2"] == 0.0
            assert t_clear >= (THRESHOLD - 1) * INTERVAL  # needs THRESHOLD consecutive normal rounds
            print(f"\nraise after {t_raise:.2f}s, clear after {t_clear:.2f}s "
                  f"(interval {INTERVAL}s, threshold {THRESHOLD})")
        finally:
            await stubs.close()
            await alarms.close()


async def test_a_restarted_coordinator_adopts_the_alarm_it_raised_and_clears_it_when_normal(tmp_path: Path) -> None:
    """The coordinator that raised an alarm is killed, the pair heals meanwhile, and a coordinator
    starts at another address (a rescheduled pod): it adopts the alarm the controller holds and,
    the pair sampling normal, clears it under the raise's identity. Before, that alarm stayed
    active for ever: nobody remembered raising it."""
    async with standalone(tmp_path) as s:
        stubs, alarms = Stubs(s.coordinator.address), Alarms(s.controller)
        try:
            await stubs.set(inst(1, Role.PREFILL, s.p), inst(2, Role.DECODE, s.d))
            await wait_for(lambda: gauges(s.coordinator).get("1-2") == 0.0, timeout=5, what="group 1-2 sampled")
            set_fault(s.d.port, "wrong_answers")
            raised = await wait_for(lambda: alarms.active([1, 2]), timeout=5, what="precision alarm RAISE")
            s.coordinator.kill()  # SIGKILL: nothing of its state survives
            s.coordinator.popen.wait(10)
            await stubs.close()
            set_fault(s.d.port, "none")
        finally:
            await alarms.close()
        cfg = precision_config(controller_address=s.controller.address)
        async with start_coordinator(tmp_path, cfg, management_key=KEY, name="coordinator-again") as again:
            assert again.address != s.coordinator.address
            stubs, alarms = Stubs(again.address), Alarms(s.controller)
            try:
                await stubs.set(inst(1, Role.PREFILL, s.p), inst(2, Role.DECODE, s.d))
                cleared = await wait_for(lambda: alarms.cleared([1, 2]), timeout=10, what="the adopted alarm CLEARED")
                assert identity(cleared) == identity(raised)
                assert raised.source == f"coordinator@{s.coordinator.address}"
                assert not await alarms.active([1, 2]) and gauges(again)["1-2"] == 0.0
                assert "precision alarm adopted" in again.log()
            finally:
                await stubs.close()
                await alarms.close()


async def test_alarmed_pair_is_avoided_while_a_healthy_pair_serves(tmp_path: Path) -> None:
    async with standalone(tmp_path) as s, start_simulator(
        "vllm", "decode", tmp_path, env={"MOTOR_SIM_ZERO_LATENCY": "1"}, name="d2"
    ) as d2:
        stubs, alarms = Stubs(s.coordinator.address), Alarms(s.controller)
        try:
            await stubs.set(inst(1, Role.PREFILL, s.p), inst(2, Role.DECODE, s.d), inst(3, Role.DECODE, d2))
            await wait_for(lambda: gauges(s.coordinator).get("1-3") == 0.0, timeout=5, what="groups sampled")
            set_fault(s.d.port, "wrong_answers")
            await wait_for(lambda: alarms.active([1, 2]), timeout=5, what="precision alarm on 1-2")
            assert not await alarms.active([1, 3])
            decodes = set()
            for i in range(6):
                call = stubs.dispatch.Dispatch(kpb.DispatchRequest(
                    api=kpb.OPEN_AI_API_COMPLETIONS,
                    body=orjson.dumps({"model": MODEL, "prompt": f"q{i}", "max_tokens": 2})), timeout=10)
                async for frame in call:
                    if frame.HasField("head"):
                        assert frame.head.http_status == 200
                        decodes.add(frame.head.decode_instance_id)
            assert decodes == {3}
        finally:
            await stubs.close()
            await alarms.close()


# -- paths (1) and (2): managed fleet ----------------------------------------------------------------
async def start_pair(f: Fleet) -> tuple[int, int, int]:
    """P and D nodes ACTIVE and sampled normal; (p id, d id, d engine port)."""
    await f.add_node("p0", "job-p", "prefill")
    await f.add_node("d0", "job-d", "decode")
    await wait_for(lambda: f.active("job-p", "job-d"), timeout=20, what="P and D ACTIVE")
    p, d = await f.live_instance("job-p"), await f.live_instance("job-d")
    assert p is not None and d is not None
    label = f"{p.instance.id}-{d.instance.id}"
    await wait_for(lambda: gauges(f.coordinator).get(label) == 0.0, timeout=10, what="the pair sampled normal")
    return p.instance.id, d.instance.id, d.instance.endpoints[0].business_port


def gateway_completion(f: Fleet) -> bool:
    resp = post(f"{f.gateway.url}/v1/completions", {"model": MODEL, "prompt": "after", "max_tokens": 4})
    return bool(resp.get("choices"))


async def test_manual_terminate_with_precision_alarm_clear_clears_with_the_same_identity(tmp_path: Path) -> None:
    async with fleet(tmp_path, coordinator_config=precision_config(), enable_precision_recovery=False) as f:
        alarms = Alarms(f.controller, FLEET_KEY)
        try:
            pid, did, dport = await start_pair(f)
            set_fault(dport, "wrong_answers")
            raised = await wait_for(lambda: alarms.active(sorted([pid, did])), timeout=5, what="alarm RAISE")
            t0 = time.monotonic()
            stub = cgrpc.ControllerAdminServiceStub(f.channel(f.controller.address))
            await stub.TerminateInstance(cpb.TerminateInstanceRequest(
                instance_id=did, precision_alarm_clear=True, reason="precision test"), metadata=f.md, timeout=10)
            cleared = await alarms.cleared(sorted([pid, did]))
            assert cleared is not None and identity(cleared) == identity(raised)
            assert not await alarms.active(sorted([pid, did]))
            await wait_for(lambda: gauges(f.coordinator).get(f"{pid}-{did}") is None, timeout=5,
                           what="the coordinator to drop the group")
            assert clear_calls(f.coordinator) >= 1  # the controller told the coordinator
            # The decode node is rescheduled; the new pair serves and samples normal.
            new_d = await wait_for(lambda: _new_live(f, "job-d", did), timeout=20, what="decode rescheduled")
            await wait_for(lambda: gauges(f.coordinator).get(f"{pid}-{new_d}") == 0.0, timeout=10,
                           what="the new pair sampled normal")
            assert gateway_completion(f)
            print(f"\nmanual clear; new pair serving {time.monotonic() - t0:.2f}s after the terminate")
        finally:
            await alarms.close()


async def test_auto_recovery_terminates_the_pair_clears_and_drops_coordinator_state(tmp_path: Path) -> None:
    async with fleet(tmp_path, coordinator_config=precision_config()) as f:
        alarms = Alarms(f.controller, FLEET_KEY)
        try:
            pid, did, dport = await start_pair(f)
            group = sorted([pid, did])
            t0 = time.monotonic()
            set_fault(dport, "wrong_answers")
            cleared = await wait_for(lambda: alarms.cleared(group), timeout=10, what="auto-recovery CLEAR")
            t_clear = time.monotonic() - t0
            assert cleared.source == f"coordinator@{f.coordinator.address}"
            assert "auto-recovery" in cleared.message
            assert not await alarms.active(group)
            await wait_for(lambda: gauges(f.coordinator).get(f"{pid}-{did}") is None, timeout=5,
                           what="the coordinator to drop the group")
            assert clear_calls(f.coordinator) >= 1  # the controller told the coordinator
            new_p = await wait_for(lambda: _new_live(f, "job-p", pid), timeout=20, what="prefill rescheduled")
            new_d = await wait_for(lambda: _new_live(f, "job-d", did), timeout=20, what="decode rescheduled")
            await wait_for(lambda: gauges(f.coordinator).get(f"{new_p}-{new_d}") == 0.0, timeout=10,
                           what="the new pair sampled normal")
            await wait_for(lambda: gateway_completion(f), timeout=5, what="a request through the gateway")
            assert not await alarms.list(True)
            print(f"\nauto-recovery: CLEAR {t_clear:.2f}s after the fault, new pair serving "
                  f"{time.monotonic() - t0:.2f}s after it; restarts {[n.restarts for n in f.nodes.values()]}")
        finally:
            await alarms.close()


async def _new_live(f: Fleet, job: str, old_id: int) -> int | None:
    mi = await f.live_instance(job)
    if mi is None or mi.instance.id == old_id or mi.state != cpb.INSTANCE_STATE_ACTIVE:
        return None
    return int(mi.instance.id)
