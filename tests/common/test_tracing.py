"""W3C trace-context parsing and the tracing config (pure; no sockets)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from motor_common.config import load_config
from motor_common.errors import ConfigError
from motor_common.tracing import (
    TRACEPARENT,
    TRACESTATE,
    Tracer,
    TracingConfig,
    carrier_from,
    reset_tracing,
    setup_tracing,
    valid_traceparent,
)

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize("value", [
    TP,
    "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",  # a later version, unsampled
])
def test_valid_traceparents_are_accepted(value: str) -> None:
    assert valid_traceparent(value)


@pytest.mark.parametrize("value", [
    "", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff is invalid
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero parent id
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
])
def test_malformed_traceparents_are_refused(value: str) -> None:
    assert not valid_traceparent(value)


def test_carrier_takes_the_trace_headers_case_insensitively_and_drops_the_rest() -> None:
    got = carrier_from({"TraceParent": TP, "TraceState": "k=v", "X-Request-Id": "r1"})
    assert got == ((TRACEPARENT, TP), (TRACESTATE, "k=v"))
    # gRPC metadata pairs (binary values are skipped)
    assert carrier_from([("traceparent", TP), ("x-bin", b"\x00")]) == ((TRACEPARENT, TP),)


def test_a_tracestate_is_kept_only_with_a_valid_traceparent_and_within_bounds() -> None:
    assert carrier_from({"tracestate": "k=v"}) == ()
    assert carrier_from({"traceparent": "garbage", "tracestate": "k=v"}) == ()
    assert carrier_from({"traceparent": TP, "tracestate": "k=" + "v" * 600}) == ((TRACEPARENT, TP),)
    assert carrier_from({"traceparent": TP, "tracestate": "k=\x00"}) == ((TRACEPARENT, TP),)


def test_tracing_off_passes_the_parent_carrier_on_unchanged() -> None:
    carrier = carrier_from({"traceparent": TP, "tracestate": "a=1"})
    t = Tracer()
    with t.span("x", carrier) as outer:
        inner = t.start("y", outer)
        assert outer.carrier == inner.carrier == carrier and not outer.recording


@pytest.mark.parametrize(("cfg", "msg"), [
    ({"otlp_endpoint": "collector:4317"}, "tracing.otlp_endpoint"),
    ({"otlp_endpoint": "grpc://collector:4317"}, "tracing.otlp_endpoint"),
    ({"sample_ratio": 1.5}, "tracing.sample_ratio"),
    ({"export_timeout_sec": 0}, "tracing.export_timeout_sec"),
    ({"enabled": True, "exporter": "jaeger"}, "exporter"),
])
def test_bad_tracing_settings_are_refused_naming_the_key(cfg: dict[str, object], msg: str, tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as err:
        load_config(TracingConfig, str(path))
    assert msg in err.value.message


def test_an_unsampled_trace_records_nothing_and_passes_its_context_on() -> None:
    exporter = InMemorySpanExporter()
    t = setup_tracing(TracingConfig(enabled=True, sample_ratio=0.0), "test", exporter=exporter)
    try:
        unsampled = carrier_from({"traceparent": TP[:-2] + "00"})
        root = t.start("root", unsampled, kind="server")
        child = t.start("child", root)
        assert not root.recording and not child.recording
        tp = dict(child.carrier)[TRACEPARENT]
        assert tp.split("-")[1] == TP.split("-")[1] and tp.endswith("-00")  # same trace, not sampled
        assert child.carrier == root.carrier
        child.end()
        root.end()
        # a trace that starts here is not sampled at ratio 0 either; a sampled parent is followed
        assert not t.start("fresh", ()).recording
        followed = t.start("followed", carrier_from({"traceparent": TP}))
        assert followed.recording
        followed.end()
        assert [s.name for s in exporter.get_finished_spans()] == ["followed"]
    finally:
        reset_tracing()
