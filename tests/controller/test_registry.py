from __future__ import annotations

from dataclasses import replace

import pytest

from motor_common.domain import Endpoint
from motor_common.errors import AlreadyExists, InvalidArgument
from motor_controller.registry import Registration, decide_registration, validate_spec
from tests.controller.factories import record, spec


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"node_id": ""}, "node_id is required"),
        ({"node_id": "bad id"}, "node_id"),
        ({"job_name": ""}, "job_name is required"),
        ({"ip": "not-an-ip"}, "ip"),
        ({"admin_port": 0}, "admin_port"),
        ({"model_name": ""}, "model_name"),
        ({"nodes_per_instance": 0}, "nodes_per_instance must be >= 1"),
        ({"node_rank": 2, "nodes_per_instance": 2}, "node_rank 2 must be < nodes_per_instance 2"),
        ({"endpoints": ()}, "at least one endpoint"),
        ({"endpoints": (Endpoint(0, "10.0.0.1", 80),)}, "business_port 80"),
        ({"endpoints": (Endpoint(0, "10.9.9.9", 8000),)}, "differs from the node ip"),
        ({"endpoints": (Endpoint(0, "10.0.0.1", 8000, kv_port=70000),)}, "kv_port"),
        ({"endpoints": (Endpoint(0, "10.0.0.1", 8000), Endpoint(1, "10.0.0.1", 8000, dp_rank=1))}, "used twice"),
        ({"endpoints": (Endpoint(0, "10.0.0.1", 8000), Endpoint(0, "10.0.0.1", 8001, dp_rank=1))}, "id 0 is duplicated"),
        ({"endpoints": (Endpoint(0, "10.0.0.1", 8000, dp_rank=1),)}, "local dp_rank values"),
    ],
)
def test_invalid_specs_are_rejected_with_clear_messages(change: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InvalidArgument) as err:
        validate_spec(replace(spec(), **change))
    assert message in err.value.message and err.value.reason == "INVALID_NODE_SPEC"


def test_valid_spec_fills_endpoint_ip_and_node_id() -> None:
    s = replace(spec(), endpoints=(Endpoint(0, "", 8000),))
    out = validate_spec(s)
    assert out.endpoints[0].ip == s.ip and out.endpoints[0].node_id == s.node_id


def test_registration_decisions() -> None:
    s = spec()
    assert decide_registration(s, None, [], {}) == (Registration.NEW, [])
    assert decide_registration(s, record(s), [], {s.node_id: True}) == (Registration.IDEMPOTENT, [])
    moved = replace(s, ip="10.0.0.9", endpoints=tuple(replace(e, ip="10.0.0.9") for e in s.endpoints))
    with pytest.raises(AlreadyExists) as err:
        decide_registration(moved, record(s), [], {s.node_id: True})
    assert err.value.reason == "NODE_ID_CONFLICT"
    assert decide_registration(moved, record(s), [], {s.node_id: False}) == (Registration.REPLACE, [])
    new_ports = replace(s, admin_port=7777)
    assert decide_registration(new_ports, record(s), [], {s.node_id: True})[0] is Registration.UPDATE


def test_same_rank_under_another_node_id() -> None:
    old = spec(node_id="pod-a")
    new = spec(node_id="pod-b")
    with pytest.raises(AlreadyExists) as err:
        decide_registration(new, None, [record(old)], {"pod-a": True})
    assert err.value.reason == "NODE_RANK_TAKEN"
    assert decide_registration(new, None, [record(old)], {"pod-a": False}) == (Registration.NEW, ["pod-a"])


def test_kv_events_ports_are_range_checked_and_may_not_reuse_another_port() -> None:
    s = spec(eps=1)
    ok = replace(s, endpoints=(replace(s.endpoints[0], kv_events_port=6000, kv_events_replay_port=6001),))
    assert validate_spec(ok).endpoints[0].kv_events_replay_port == 6001
    with pytest.raises(InvalidArgument, match="kv_events_port 80 must be 0 or in"):
        validate_spec(replace(s, endpoints=(replace(s.endpoints[0], kv_events_port=80),)))
    clash = replace(s.endpoints[0], kv_events_port=6000, kv_events_replay_port=s.endpoints[0].business_port)
    with pytest.raises(InvalidArgument, match="used twice"):
        validate_spec(replace(s, endpoints=(clash,)))
