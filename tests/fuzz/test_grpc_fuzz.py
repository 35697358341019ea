"""Property-based fuzzing of every gRPC method of Motor against real servers.

A quiet fleet of real processes (a standalone coordinator; a controller with one nodemanager and
its simulated engine, settled to ACTIVE; no link between them, so nothing changes state in the
background except heartbeat times) receives, for every method, requests generated from the
method's request descriptor (tests/fuzz/grpc_strategies.py), with the right credential so the
requests reach validation and the handlers. Invariants:

- no UNKNOWN or INTERNAL status: bad input is the caller's error (INVALID_ARGUMENT, NOT_FOUND,
  FAILED_PRECONDITION, ...), never a crash;
- a rejected call changes nothing (the List* views before and after are equal: the coordinator's
  registry, the controller's nodes, instances and alarms; for nodemanager calls the controller's
  instances);
- every program is still alive and serving at the end.

``StopNode`` is left out (a valid call stops the nodemanager by design). Bounded: ``EXAMPLES``
examples per method, each call with a short deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
import yaml
from hypothesis import HealthCheck, given, settings

from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as pbg
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_client import call_metadata, open_channel
from tests.fuzz.grpc_strategies import requests
from tests.grpc_methods import Method, methods
from tests.helpers import wait_for
from tests.procs import start_controller, start_coordinator, start_nodemanager

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]

EXAMPLES = 10
OPERATOR, NODE, INFERENCE = "op-fuzz-0123456789", "node-fuzz-0123456789", "inf-fuzz-0123456789"
SKIP = {"StopNode"}
BAD = (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)


class Quiet:
    def __init__(self, addresses: dict[str, str], procs: list[Any]) -> None:
        self.addresses = addresses
        self.procs = procs
        self.channels: dict[str, grpc.aio.Channel] = {}
        # An accepted call may set things moving (a pause, a relaunch, a lease): the next
        # comparison waits until the fleet is quiet again.
        self.dirty = True

    def channel(self, program: str) -> grpc.aio.Channel:
        if program not in self.channels:
            self.channels[program] = open_channel(self.addresses[program])
        return self.channels[program]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def quiet(tmp_path_factory: Any) -> AsyncIterator[Quiet]:
    d: Path = tmp_path_factory.mktemp("fuzz")
    ops = d / "operators.yaml"
    ops.write_text(yaml.safe_dump({"fuzzer": OPERATOR}))
    nodes = d / "nodes.yaml"
    nodes.write_text(yaml.safe_dump({"nodes": NODE}))
    inference = d / "inference.yaml"
    inference.write_text(yaml.safe_dump({"fuzz": INFERENCE}))
    node_key = d / "node.key"
    node_key.write_text(NODE)
    coord_cfg = {"server": {"auth": {"operator_keys_file": str(ops), "inference_keys_file": str(inference)}}}
    async with start_coordinator(d / "coordinator", coord_cfg) as coordinator:
        ctl_cfg = {"server": {"auth": {"operator_keys_file": str(ops), "node_keys_file": str(nodes),
                                       "key_file": str(ops)}},
                   "heartbeat_interval_sec": 0.5, "heartbeat_timeout_sec": 5.0}
        async with start_controller(d / "controller", ctl_cfg) as controller:
            nm = await start_nodemanager(d, {
                "job_name": "fuzz", "role": "union", "engine_type": "vllm", "model_name": "tiny",
                "ip": "127.0.0.1", "controller_address": controller.address,
                "server": {"host": "127.0.0.1", "port": 0, "grace_seconds": 0.2,
                           "auth": {"operator_keys_file": str(ops), "key_file": str(node_key)}},
                "heartbeat_interval_seconds": 0.5, "daemon_loop_interval": 0.5,
                "health": {"poll_interval_sec": 0.2, "timeout_sec": 1.0, "startup_grace_sec": 0.0},
                "engine": {"launcher": "simulator", "env": {"MOTOR_SIM_ZERO_LATENCY": "1"},
                           "log_dir": str(d / "engines")},
                "registration": {"backoff_base_sec": 0.1, "rpc_timeout_sec": 1.0},
                "log": {"format": "text"},
            }, name="nodemanager")  # fmt: skip
            try:
                fleet = Quiet({"controller": controller.address, "coordinator": coordinator.address,
                               "nodemanager": nm.address}, [coordinator, controller, nm])
                await wait_for(lambda: _settled(fleet), timeout=60, what="the nodemanager's instance ACTIVE")
                yield fleet
                for ch in fleet.channels.values():
                    await ch.close()
            finally:
                nm.terminate()


async def _settled(fleet: Quiet) -> bool:
    resp = await pbg.ControllerAdminServiceStub(fleet.channel("controller")).ListInstances(
        pb.ListInstancesRequest(), metadata=call_metadata(OPERATOR), timeout=2)
    return [i.state for i in resp.instances] == [pb.INSTANCE_STATE_ACTIVE]


async def _snapshot(fleet: Quiet, program: str) -> tuple[bytes, ...]:
    """The List views a rejected call must leave unchanged. For calls to the nodemanager: the
    controller's instances only; its node records mirror the node's own heartbeats, which move
    on their own after an earlier accepted call (a pause, a scale-down lease running out)."""
    md = call_metadata(OPERATOR)
    if program == "nodemanager":
        insts = await pbg.ControllerAdminServiceStub(fleet.channel("controller")).ListInstances(
            pb.ListInstancesRequest(), metadata=md, timeout=5)
        return (insts.SerializeToString(deterministic=True),)
    if program == "coordinator":
        reg = await cgrpc.InstanceRegistryServiceStub(fleet.channel("coordinator")).ListInstances(
            cpb.ListInstancesRequest(), metadata=md, timeout=5)
        return (reg.SerializeToString(deterministic=True),)
    admin = pbg.ControllerAdminServiceStub(fleet.channel("controller"))
    nodes = await admin.ListNodes(pb.ListNodesRequest(), metadata=md, timeout=5)
    for n in nodes.nodes:
        n.ClearField("last_heartbeat_at")
    insts = await admin.ListInstances(pb.ListInstancesRequest(), metadata=md, timeout=5)
    alarms = await admin.ListAlarms(pb.ListAlarmsRequest(), metadata=md, timeout=5)
    return tuple(m.SerializeToString(deterministic=True) for m in (nodes, insts, alarms))


async def _quiet(fleet: Quiet, program: str) -> tuple[bytes, ...]:
    """The state once two polls in a row see the same thing (and the instance is ACTIVE)."""
    last: tuple[bytes, ...] | None = None

    async def stable() -> bool:
        nonlocal last
        current = await _snapshot(fleet, program)
        same, last = current == last, current
        return same and (program == "coordinator" or await _settled(fleet))

    await wait_for(stable, timeout=60, interval=0.1, what=f"the {program}'s state to settle")
    assert last is not None
    fleet.dirty = False
    return last


def _credential(m: Method) -> tuple[tuple[str, str], ...]:
    if m.service.endswith("DispatchService"):
        return (("authorization", f"Bearer {INFERENCE}"),)
    if m.service == "motor.controller.v1.ControllerService":
        return call_metadata(NODE)
    return call_metadata(OPERATOR)


ALL = [m for program in ("controller", "coordinator", "nodemanager") for m in methods(program) if m.name not in SKIP]


@pytest.mark.parametrize("method", ALL, ids=[m.id for m in ALL])
async def test_bad_input_never_crashes_and_rejections_change_nothing(quiet: Quiet, method: Method) -> None:
    seen: dict[str, int] = {}
    state_of = method.program

    async def check(request: Any) -> None:
        before = await (_quiet(quiet, state_of) if quiet.dirty else _snapshot(quiet, state_of))
        code = grpc.StatusCode.OK
        try:
            await method.call(quiet.channel(method.program), request, _credential(method), timeout=3)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            details = exc.details() or ""
            assert code not in BAD, f"{method.id}({request}) -> {code.name}: {details}"
            assert "Traceback" not in details and "Exception" not in details, details
        seen[code.name] = seen.get(code.name, 0) + 1
        if code in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
            quiet.dirty = True
        else:
            assert await _snapshot(quiet, state_of) == before, f"{method.id} rejected ({code.name}) but changed state"

    # Hypothesis drives synchronously from a worker thread; each example runs on this loop.
    loop = asyncio.get_running_loop()

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(request=requests(method.desc.input_type))
    def one(request: Any) -> None:
        asyncio.run_coroutine_threadsafe(check(request), loop).result(timeout=30)

    await asyncio.to_thread(one)
    assert sum(seen.values()) >= 1, seen
    for proc in quiet.procs:
        alive = proc.alive() if hasattr(proc, "alive") else proc.proc.poll() is None
        assert alive, f"{method.id}: a program died"
