"""Start-command validation: payload errors vs. validation against this node."""

from __future__ import annotations

import dataclasses

import pytest

from motor_common.domain import Endpoint, EngineType, Role
from motor_common.errors import FailedPrecondition, InvalidArgument
from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as pb
from motor_nodemanager.servicer import start_command_from_pb
from motor_nodemanager.start_command import StartCommand, check_payload, validate_for_node

NODE = {"job_name": "job", "node_ip": "10.0.0.1", "endpoint_count": 2, "role": Role.PREFILL,
        "engine_type": EngineType.VLLM, "model_name": "m"}


def good(**kw: object) -> StartCommand:
    eps = (Endpoint(0, "10.0.0.1", 8000), Endpoint(1, "10.0.0.1", 8001))
    base = StartCommand(7, "job", Role.PREFILL, EngineType.VLLM, "m", eps, dp_size=2)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_a_matching_command_passes() -> None:
    check_payload(good())
    validate_for_node(good(), **NODE)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["instance_id", "job_name", "model_name", "endpoints"])
def test_missing_fields_are_invalid_argument(field: str) -> None:
    empty = {"instance_id": 0, "job_name": "", "model_name": "", "endpoints": ()}[field]
    with pytest.raises(InvalidArgument, match=f"missing {field}"):
        check_payload(good(**{field: empty}))


def test_unset_enums_are_invalid_argument() -> None:
    req = pb.StartEnginesRequest(instance_id=1, job_name="j", model_name="m", engine_type=tpb.ENGINE_TYPE_VLLM)
    with pytest.raises(InvalidArgument, match="role"):
        start_command_from_pb(req)
    req.role = tpb.ROLE_DECODE
    req.engine_type = tpb.ENGINE_TYPE_UNSPECIFIED
    with pytest.raises(InvalidArgument, match="engine_type"):
        start_command_from_pb(req)


def test_duplicate_endpoint_ids_are_invalid_argument() -> None:
    eps = (Endpoint(0, "10.0.0.1", 8000), Endpoint(0, "10.0.0.1", 8001))
    with pytest.raises(InvalidArgument, match="duplicate"):
        check_payload(good(endpoints=eps))


@pytest.mark.parametrize(
    ("change", "reason", "text"),
    [
        ({"job_name": "other"}, "JOB_NAME_MISMATCH", "job name"),
        ({"engine_type": EngineType.SGLANG}, "ENGINE_TYPE_MISMATCH", "engine type sglang != node engine type vllm"),
        ({"model_name": "--trust-remote-code"}, "MODEL_NAME_MISMATCH", "model name"),
        ({"endpoints": (Endpoint(0, "10.0.0.1", 8000),)}, "ENDPOINT_COUNT_MISMATCH", "endpoints"),
        ({"endpoints": (Endpoint(0, "10.0.0.1", 8000), Endpoint(1, "10.0.0.2", 8001))}, "ENDPOINT_IP_MISMATCH", "ip"),
        ({"endpoints": (Endpoint(0, "10.0.0.1", 8000), Endpoint(1, "host", 8001))}, "INVALID_ENDPOINT_IP", "IPv4"),
        ({"endpoints": (Endpoint(0, "10.0.0.1", 8000), Endpoint(1, "10.0.0.1", 80))}, "INVALID_ENDPOINT_PORT", "1024"),
        ({"endpoints": (Endpoint(0, "10.0.0.1", 8000), Endpoint(1, "10.0.0.1", 70000))}, "INVALID_ENDPOINT_PORT", "65535"),
        ({"role": Role.DECODE}, "ROLE_MISMATCH", "role"),
    ],
)
def test_node_mismatches_are_failed_precondition_with_the_validation_prefix(
    change: dict[str, object], reason: str, text: str
) -> None:
    with pytest.raises(FailedPrecondition) as err:
        validate_for_node(good(**change), **NODE)  # type: ignore[arg-type]
    assert err.value.message.startswith("Start command validation failed: ")
    assert text in err.value.message
    assert err.value.reason == reason


def test_ipv6_endpoint_ip_is_normalised_before_comparison() -> None:
    eps = (Endpoint(0, "[fd00::0001]", 8000), Endpoint(1, "fd00:0::1", 8001))
    validate_for_node(good(endpoints=eps), job_name="job", node_ip="fd00::1", endpoint_count=2)


def test_same_launch_ignores_generation_only() -> None:
    assert good().same_launch(good(generation=9))
    assert not good().same_launch(good(model_name="other"))


@pytest.mark.parametrize(("change", "words"), [
    ({"model_name": "m\x00"}, "model_name has a control character"),
    ({"job_name": "job\n"}, "job_name has a control character"),
    ({"master_address": "10.0.0.1\x00", "num_nodes": 2}, "master_address"),
    ({"master_address": "host --flag", "num_nodes": 2}, "master_address"),
    ({"peers": (Endpoint(5, "10.0.0.2\x00", 8000),)}, "peer 5"),
    ({"peers": (Endpoint(5, "peer-host", 8000),)}, "peer 5"),
])
def test_what_reaches_the_engines_command_line_is_checked_first(change: dict[str, object], words: str) -> None:
    """A NUL in a string that becomes argv or environment made the spawn raise ValueError: an
    INTERNAL error instead of INVALID_ARGUMENT naming the field."""
    with pytest.raises(InvalidArgument, match=words) as err:
        check_payload(good(**change))
    assert err.value.reason == "INVALID_START_COMMAND"


@pytest.mark.parametrize("master", ["10.0.0.1", "node-0.motor.svc.cluster.local", "fd00::1", "[fd00::1]"])
def test_host_names_and_ips_are_accepted_as_master_address(master: str) -> None:
    check_payload(good(master_address=master, num_nodes=2))
