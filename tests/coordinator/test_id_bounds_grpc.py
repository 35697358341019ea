"""A real motor-coordinator refuses, on every registry call, an instance id or a generation above
2^53 - 1 (the largest integer every language's default number type and JSON carry exactly) with
INVALID_ARGUMENT, reason OUT_OF_RANGE and a message naming the field and the allowed range, before
the registry sees it: nothing changes. Also through grpcurl, i.e. a JSON client sending the id as a
string."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from motor_common.convert import instance_to_pb
from motor_common.domain import Role
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.grpc_server import error_reason
from tests.conftest import tool
from tests.coordinator.factories import inst
from tests.coordinator.grpc_util import KEY, MD, Stubs
from tests.procs import start_coordinator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

MAX = 2**53 - 1
P, D = inst(1, Role.PREFILL), inst(2, Role.DECODE)
BAD = [2**53, 2**63, 2**64 - 1]


@pytest.fixture
async def stubs(tmp_path: Path) -> AsyncIterator[tuple[str, Stubs]]:
    async with start_coordinator(tmp_path, management_key=KEY) as proc:
        s = Stubs(proc.address)
        await s.set(P, D, generation=3)
        yield proc.address, s
        await s.close()


def _pb_with_id(value: int) -> Any:
    msg = instance_to_pb(P)
    msg.id = value
    return msg


# method, request builder for a bad value, the field the message must name, the allowed range
CASES: list[tuple[str, Callable[[int], Any], str, str]] = [
    ("SetInstances", lambda v: cpb.SetInstancesRequest(instances=[instance_to_pb(P)], generation=v), "generation", f"[0, {MAX}]"),
    ("SetInstances", lambda v: cpb.SetInstancesRequest(instances=[_pb_with_id(v)]), "instances[0].id", f"[1, {MAX}]"),
    ("AddInstances", lambda v: cpb.AddInstancesRequest(instances=[instance_to_pb(D)], generation=v), "generation", f"[0, {MAX}]"),
    ("AddInstances", lambda v: cpb.AddInstancesRequest(instances=[_pb_with_id(v)]), "instances[0].id", f"[1, {MAX}]"),
    ("DeleteInstances", lambda v: cpb.DeleteInstancesRequest(instances=[instance_to_pb(P)], generation=v), "generation", f"[0, {MAX}]"),
    ("DeleteInstances", lambda v: cpb.DeleteInstancesRequest(instances=[_pb_with_id(v)]), "instances[0].id", f"[1, {MAX}]"),
    ("PauseInstances", lambda v: cpb.PauseInstancesRequest(instance_ids=[1], generation=v), "generation", f"[0, {MAX}]"),
    ("PauseInstances", lambda v: cpb.PauseInstancesRequest(instance_ids=[1, v]), "instance_ids[1]", f"[1, {MAX}]"),
    ("ResumeInstances", lambda v: cpb.ResumeInstancesRequest(instance_ids=[1], generation=v), "generation", f"[0, {MAX}]"),
    ("ResumeInstances", lambda v: cpb.ResumeInstancesRequest(instance_ids=[v]), "instance_ids[0]", f"[1, {MAX}]"),
    ("GetInstance", lambda v: cpb.GetInstanceRequest(instance_id=v), "instance_id", f"[1, {MAX}]"),
    ("ClearPrecisionAlarms", lambda v: cpb.ClearPrecisionAlarmsRequest(instance_ids=[v]), "instance_ids[0]", f"[1, {MAX}]"),
]


@pytest.mark.parametrize("value", BAD)
async def test_ids_and_generations_above_2_pow_53_minus_1_are_invalid_argument_and_change_nothing(
    stubs: tuple[str, Stubs], value: int,
) -> None:
    _, s = stubs
    before = await s.list()
    for method, build, field, allowed in CASES:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await getattr(s.registry, method)(build(value), metadata=MD, timeout=5)
        e = err.value
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, e.details())
        assert error_reason(e) == "OUT_OF_RANGE", (method, e.details())
        assert e.details() == f"{field} {value} is outside {allowed}", method
    after = await s.list()
    assert (after.generation, list(after.instances)) == (before.generation, list(before.instances)) == (
        3, list(before.instances))


async def test_the_largest_id_and_generation_are_accepted(stubs: tuple[str, Stubs]) -> None:
    _, s = stubs
    big = inst(MAX, Role.DECODE, (9000,), job="big")
    assert (await s.set(P, D, big, generation=MAX)).generation == MAX
    assert (await s.registry.GetInstance(cpb.GetInstanceRequest(instance_id=MAX), metadata=MD, timeout=5)).instance.id == MAX


async def test_a_json_client_gets_the_same_answer(stubs: tuple[str, Stubs]) -> None:
    address, _ = stubs
    out = await asyncio.to_thread(
        subprocess.run,
        [tool("grpcurl"), "-plaintext", "-H", f"x-motor-management-key: {KEY}",
         "-d", json.dumps({"instance_ids": [str(2**53 + 1)], "generation": "4"}), address,
         "motor.coordinator.v1.InstanceRegistryService/PauseInstances"],
        capture_output=True, text=True, timeout=20)
    assert out.returncode != 0
    assert "Code: InvalidArgument" in out.stderr
    assert f"instance_ids[0] {2**53 + 1} is outside [1, {MAX}]" in out.stderr
