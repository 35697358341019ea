"""Request bounds checked by the chassis before any handler (pure)."""

from __future__ import annotations

import math

import pytest

from motor_common.errors import InvalidArgument
from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as npb
from motor_common.request_limits import MAX_INSTANCE_ID, MAX_REPEATED, check_request, count_fields


def _inst(**over: object) -> tpb.Instance:
    fields: dict[str, object] = {"id": 7, "role": tpb.ROLE_UNION, "job_name": "j", "model_name": "m",
                                 "endpoints": [tpb.Endpoint(ip="127.0.0.1", business_port=8000)]}
    fields.update(over)
    return tpb.Instance(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("request_msg", "field", "words"),
    [
        (cpb.AddInstancesRequest(instances=[_inst(id=0)]), "instances[0].id", "ids start at 1"),
        (cpb.AddInstancesRequest(instances=[_inst(id=MAX_INSTANCE_ID + 1)]), "instances[0].id", "outside [1,"),
        (cpb.AddInstancesRequest(instances=[_inst(endpoints=[tpb.Endpoint(ip="127.0.0.1", business_port=70000)])]),
         "instances[0].endpoints[0].business_port", "outside [1, 65535]"),
        (cpb.PauseInstancesRequest(instance_ids=[3, 0]), "instance_ids[1]", "outside [1,"),
        (cpb.GetInstanceRequest(), "instance_id", "instance ids start at 1"),
        (pb.TerminateInstanceRequest(), "instance_id", "instance ids start at 1"),
        (cpb.ListInstancesRequest(page_token="x" * 5000), "page_token", "at most 4096"),
        (cpb.SetInstancesRequest(request_id="r" * 300), "request_id", "at most 256"),
        (cpb.PauseInstancesRequest(instance_ids=list(range(1, MAX_REPEATED + 2))), "instance_ids", "items"),
        (npb.GuardScaleDownRequest(instance_id=1, lease_seconds=math.nan), "lease_seconds", "finite"),
        (npb.GuardScaleDownRequest(instance_id=1, lease_seconds=1e9), "lease_seconds", "outside"),
        (npb.StartEnginesRequest(instance_id=1, master_port=65536), "master_port", "outside [0, 65535]"),
        (pb.RegisterNodeRequest(node=pb.NodeSpec(node_id="n", admin_port=99999)), "node.admin_port", "outside"),
        (pb.RegisterNodeRequest(node=pb.NodeSpec(node_id="n" * 300)), "node.node_id", "at most 256"),
    ],
)
def test_out_of_bounds_fields_are_named_with_their_allowed_range(request_msg: object, field: str, words: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        check_request(request_msg)
    assert err.value.metadata["field"] == field
    assert field in err.value.message and words in err.value.message
    assert err.value.reason in ("OUT_OF_RANGE", "TOO_LONG")


def test_valid_requests_pass() -> None:
    for msg in (cpb.AddInstancesRequest(instances=[_inst()]), cpb.ListInstancesRequest(page_size=100),
                npb.GuardScaleDownRequest(instance_id=1, lease_seconds=30, dead_dp_ranks=[1]),
                pb.ListNodesRequest(), cpb.DispatchRequest(body=b"{}")):
        check_request(msg)


@pytest.mark.parametrize(("seconds", "nanos"), [(2**62, 0), (-62_135_596_801, 0), (253_402_300_800, 0),
                                                 (0, -1), (0, 1_000_000_000)])
def test_a_timestamp_outside_its_types_range_is_invalid_argument(seconds: int, nanos: int) -> None:
    """It became INTERNAL when the handler converted it (``Timestamp is not valid``)."""
    msg = pb.ReportAlarmRequest(alarm=pb.Alarm(kind=pb.ALARM_KIND_STORE_UNAVAILABLE, action=pb.ALARM_ACTION_RAISE,
                                               source="x", raised_at={"seconds": seconds, "nanos": nanos}))
    with pytest.raises(InvalidArgument) as err:
        check_request(msg)
    assert err.value.reason == "OUT_OF_RANGE" and err.value.metadata["field"] == "alarm.raised_at"
    assert "years 1-9999" in err.value.message
    with pytest.raises(ValueError):  # what the handler's conversion did with it
        msg.alarm.raised_at.ToNanoseconds()


def test_timestamps_at_the_ends_of_the_range_pass_and_convert() -> None:
    for seconds, nanos in ((-62_135_596_800, 0), (253_402_300_799, 999_999_999), (1_796_000_000, 5)):
        msg = pb.ReportAlarmRequest(alarm=pb.Alarm(kind=pb.ALARM_KIND_STORE_UNAVAILABLE, action=pb.ALARM_ACTION_RAISE,
                                                   source="x", raised_at={"seconds": seconds, "nanos": nanos}))
        check_request(msg)
        assert msg.alarm.raised_at.ToNanoseconds() == seconds * 10**9 + nanos


def test_fields_are_counted_on_the_wire_nested_ones_and_map_entries_included() -> None:
    start = cpb.DispatchStart(request=cpb.DispatchRequest(request_id="r", api=cpb.OPEN_AI_API_COMPLETIONS, body=b"x" * 99),
                              timeout_ms=1000, trace_context={"traceparent": "00-1"})
    batch = cpb.DispatchManyRequest(commands=[cpb.DispatchCommand(stream_id=i + 1, start=start) for i in range(256)])
    # per command: itself, stream_id, start, request (+ its 3 fields), timeout_ms, one map entry (+ key, value)
    assert count_fields(batch.SerializeToString(), cpb.DispatchManyRequest.DESCRIPTOR, 10**6) == 256 * 11
    # packed numbers count one per byte: instance_id, lease_seconds, dead_dp_ranks + its 3 bytes
    packed = npb.GuardScaleDownRequest(instance_id=1, lease_seconds=30, dead_dp_ranks=[1, 2, 3]).SerializeToString()
    assert count_fields(packed, npb.GuardScaleDownRequest.DESCRIPTOR, 100) == 6


def test_counting_stops_just_past_the_budget_and_at_bytes_that_are_no_wire_format() -> None:
    hostile = b"\x0a\x00" * (8 << 20)  # 8 million empty commands in 16 MiB
    assert count_fields(hostile, cpb.DispatchManyRequest.DESCRIPTOR, 50_000) == 50_001
    assert count_fields(b"\x0a\xff\xff\xff\x0f", cpb.DispatchManyRequest.DESCRIPTOR, 50_000) == 1  # length past the end
    assert count_fields(b"\xff" * 20, cpb.DispatchManyRequest.DESCRIPTOR, 50_000) == 1  # a varint that never ends
