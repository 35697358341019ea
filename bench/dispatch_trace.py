"""Cost of the dispatcher's per-request tracing and PD-phase metrics (``dispatch_trace``), in process.

    .venv/bin/python bench/dispatch_trace.py [--requests 20000]

One PD request's bookkeeping, as the dispatcher does it: a ``DispatchTrace``, a prefill call
(answered 200: one phase observation), a decode call (head, first byte: two observations, end),
the request's end. Measured with tracing off (the default: pass-through spans, the incoming
traceparent carried) and on (OpenTelemetry SDK spans, an exporter that drops them, so the SDK's
own cost without any network; and with ``sample_ratio: 0``, unsampled). For scale, one Prometheus histogram observation is timed too.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from motor_common.domain import Endpoint, EngineType, Instance, InstanceStatus, Role
from motor_common.tracing import TracingConfig, reset_tracing, setup_tracing
from motor_coordinator.dispatch_trace import DispatchTrace
from motor_coordinator.policies import Candidate
from motor_coordinator.request_metrics import TTFT

EP = Endpoint(0, "127.0.0.1", 8001)
CAND = Candidate(Instance(1, Role.PREFILL, "job", "bench", EngineType.VLLM, (EP,), InstanceStatus.AVAILABLE), EP)
CARRIER = (("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),)


class _Drop(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def one_request(carrier: tuple[tuple[str, str], ...] = CARRIER) -> None:
    t = DispatchTrace("bench", "rid", carrier, stream=True)
    p = t.call("prefill", CAND)
    _ = p.carrier
    p.answered(200)
    d = t.call("decode", CAND)
    _ = d.carrier
    d.head(200)
    d.first_byte()
    d.end()
    t.end()


def per_call_us(fn: object, n: int) -> float:
    f = fn  # type: ignore[assignment]
    for _ in range(min(n, 500)):
        f()  # type: ignore[operator]
    t0 = time.perf_counter()
    for _ in range(n):
        f()  # type: ignore[operator]
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20000)
    n = ap.parse_args().requests
    child = TTFT.labels("bench", "pd")
    print(f"one histogram observation (scale):          {per_call_us(lambda: child.observe(0.1), n):8.1f} us")
    reset_tracing()
    print(f"tracing off, per PD request:                {per_call_us(one_request, n):8.1f} us")
    setup_tracing(TracingConfig(enabled=True), "bench", exporter=_Drop())
    try:
        print(f"tracing on (6 spans, dropped), per request: {per_call_us(one_request, max(n // 4, 1)):8.1f} us")
    finally:
        reset_tracing()
    setup_tracing(TracingConfig(enabled=True, sample_ratio=0.0), "bench", exporter=_Drop())
    try:  # a trace that starts here (no incoming traceparent), not sampled: non-recording spans
        print(f"tracing on, sample_ratio 0, per request:    "
              f"{per_call_us(lambda: one_request(()), max(n // 4, 1)):8.1f} us")
    finally:
        reset_tracing()


if __name__ == "__main__":
    main()
