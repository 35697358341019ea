"""Which engines' KV events the coordinator follows, from the registry (pure)."""

from __future__ import annotations

from dataclasses import replace

from motor_common.domain import EngineType, Role
from motor_common.kv_events import Flavour
from motor_coordinator.kv_sources import event_sources
from motor_coordinator.kv_subscriber import EventSource
from tests.coordinator.factories import ep, inst


def test_prefill_and_union_endpoints_with_an_events_port_are_followed_decode_and_silent_ones_not() -> None:
    p = inst(1, Role.PREFILL, endpoints=(replace(ep(9001), kv_events_port=7001, kv_events_replay_port=7101),
                                         replace(ep(9002, id=1), kv_events_port=7002)))  # fmt: skip
    u = inst(2, Role.UNION, engine=EngineType.SGLANG,
             endpoints=(replace(ep(9003, ip="fd00::1"), kv_events_port=7003),))  # fmt: skip
    d = inst(3, Role.DECODE, endpoints=(replace(ep(9004), kv_events_port=7004),))
    silent = inst(4, Role.PREFILL, endpoints=(ep(9005),))
    assert event_sources([p, u, d, silent]) == [
        EventSource("1/127.0.0.1:9001", "m", Flavour.VLLM, "tcp://127.0.0.1:7001", "tcp://127.0.0.1:7101"),
        EventSource("1/127.0.0.1:9002", "m", Flavour.VLLM, "tcp://127.0.0.1:7002", None),
        EventSource("2/[fd00::1]:9003", "m", Flavour.SGLANG, "tcp://[fd00::1]:7003", None),
    ]
