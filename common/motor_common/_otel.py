"""The OpenTelemetry side of :mod:`motor_common.tracing` (imported only when tracing is on: it
needs the ``otel`` extra)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.status import Status, StatusCode

from motor_common.tracing import (
    AttrValue,
    Carrier,
    Kind,
    Parent,
    PassthroughSpan,
    Span,
    Tracer,
    TracingConfig,
    carrier_from,
)
from motor_common.version import motor_version

_KINDS = {"server": trace.SpanKind.SERVER, "client": trace.SpanKind.CLIENT,
          "internal": trace.SpanKind.INTERNAL}
_PROPAGATOR = TraceContextTextMapPropagator()
_SHUTDOWN_SEC = 3.0


class _OtelSpan:
    __slots__ = ("_carrier", "span")

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self._carrier: Carrier | None = None

    @property
    def recording(self) -> bool:
        return self.span.is_recording()

    @property
    def carrier(self) -> Carrier:
        if self._carrier is None:
            out: dict[str, str] = {}
            _PROPAGATOR.inject(out, context=trace.set_span_in_context(self.span))
            self._carrier = carrier_from(out)
        return self._carrier

    def set(self, key: str, value: AttrValue) -> None:
        self.span.set_attribute(key, value)

    def event(self, name: str, attrs: Mapping[str, AttrValue] | None = None) -> None:
        self.span.add_event(name, dict(attrs or {}))

    def fail(self, description: str) -> None:
        self.span.set_status(Status(StatusCode.ERROR, description[:200]))

    def end(self) -> None:
        self.span.end()


class OtelTracer(Tracer):
    enabled = True

    def __init__(self, cfg: TracingConfig, service: str, exporter: SpanExporter | None) -> None:
        resource = Resource.create({"service.name": f"motor-{service}", "service.version": motor_version()})
        sampler = ParentBased(TraceIdRatioBased(cfg.sample_ratio))
        self.provider = TracerProvider(resource=resource, sampler=sampler)
        if exporter is not None:
            self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            otlp = OTLPSpanExporter(endpoint=cfg.otlp_endpoint, insecure=cfg.otlp_endpoint.startswith("http://"),
                                    timeout=cfg.export_timeout_sec)
            self.provider.add_span_processor(BatchSpanProcessor(otlp, schedule_delay_millis=1000))
        self._tracer = self.provider.get_tracer("motor", motor_version())

    def start(self, name: str, parent: Parent, *, kind: Kind = "internal",
              attrs: Mapping[str, AttrValue] | None = None) -> Span:
        if isinstance(parent, _OtelSpan):
            if not parent.recording:  # an unsampled trace: its children are not recorded either
                return PassthroughSpan(parent.carrier)
            ctx: Any = trace.set_span_in_context(parent.span)
        elif isinstance(parent, tuple):
            ctx = _PROPAGATOR.extract(dict(parent)) if parent else Context()
        else:  # a pass-through span (installed before tracing was): its carrier
            ctx = _PROPAGATOR.extract(dict(parent.carrier)) if parent.carrier else Context()
        span = self._tracer.start_span(name, context=ctx, kind=_KINDS[kind], attributes=dict(attrs or {}))
        return _OtelSpan(span)

    def shutdown(self) -> None:
        """Export what is left, waiting at most ``_SHUTDOWN_SEC``: an unreachable collector must not
        hold a stopping program for the exporter's retries (the SDK would wait up to 30 s)."""
        t = threading.Thread(target=self.provider.shutdown, name="otel-shutdown", daemon=True)
        t.start()
        t.join(_SHUTDOWN_SEC)
