"""Domain <-> protobuf conversion keeps every endpoint field."""

from __future__ import annotations

from motor_common.convert import endpoint_from_pb, endpoint_to_pb
from motor_common.domain import Endpoint


def test_endpoint_round_trip_keeps_the_kv_events_ports() -> None:
    ep = Endpoint(3, "10.0.0.2", 8001, bootstrap_port=8100, kv_port=8200, dp_rank=3, node_id="n1",
                  kv_events_port=8300, kv_events_replay_port=8400)  # fmt: skip
    msg = endpoint_to_pb(ep)
    assert (msg.kv_events_port, msg.kv_events_replay_port) == (8300, 8400)
    assert endpoint_from_pb(msg) == ep
