"""W3C trace context across gateway → coordinator → engines, and OpenTelemetry spans (optional).

Two modes, one interface (:class:`Tracer`):

* **off** (the default, and whenever the ``otel`` extra is not wanted): no span is made, but an
  incoming ``traceparent`` / ``tracestate`` is carried through unchanged — HTTP header at the
  gateway, ``DispatchStart.trace_context`` (DispatchMany) or gRPC metadata (Dispatch), HTTP header on every engine request — so a tracing client
  and tracing engines (vLLM ``--otlp-traces-endpoint``) still see one trace.
* **on** (``tracing.enabled: true``, needs ``pip install 'motor-pd[otel]'``): every program makes
  its spans with the OpenTelemetry SDK and exports them over OTLP/gRPC to
  ``tracing.otlp_endpoint``; what is sent downstream is the context of the span that sends it.

A *carrier* is the validated trace headers of one hop, ``(("traceparent", v), ("tracestate", v))``
(lower-case names: valid as HTTP headers and as gRPC metadata keys). A malformed ``traceparent``
is dropped (as the W3C spec says: start a new trace), a ``tracestate`` without a valid
``traceparent`` too; values are bounded, so a client cannot make the process carry kilobytes.

``incoming`` is a ContextVar holding the span (or, off, the carrier) of the request the current
task serves; the gateway's middleware sets it, the clients it calls read it. The OpenTelemetry
packages are imported only when tracing is on.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
HEADERS = (TRACEPARENT, TRACESTATE)

Carrier = tuple[tuple[str, str], ...]
Kind = Literal["server", "client", "internal"]
AttrValue = str | int | float | bool

# version-traceid-parentid-flags, lower-case hex (W3C Trace Context, level 1)
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_TRACESTATE_MAX = 512  # the spec allows 32 members; 512 characters is what propagators keep
_TRACESTATE_CHARS = re.compile(r"^[\x20-\x7e]*$")

MISSING_EXTRA = ("tracing.enabled is true but the OpenTelemetry packages are not installed: "
                 "install Motor with the otel extra (pip install 'motor-pd[otel]'), or set "
                 "tracing.enabled: false")


def otel_available() -> bool:
    """The ``otel`` extra (SDK and OTLP/gRPC exporter) is importable."""
    try:
        return all(importlib.util.find_spec(m) is not None for m in (
            "opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"))
    except ImportError:  # a parent package is missing or broken
        return False


@dataclass(frozen=True)
class TracingConfig:
    """The ``tracing`` section every serving program (gateway, coordinator) shares."""

    # Make spans and export them (needs the otel extra). Off: trace headers are only passed on.
    enabled: bool = False
    # OTLP/gRPC collector (an OpenTelemetry Collector, Jaeger, Tempo): http:// = plaintext,
    # https:// = TLS.
    otlp_endpoint: str = "http://127.0.0.1:4317"
    # Fraction of the traces that start here (no sampled traceparent came in) that are recorded;
    # an incoming traceparent's sampled flag is always followed.
    sample_ratio: float = 1.0
    # Bound of one export call to the collector.
    export_timeout_sec: float = 10.0

    def __post_init__(self) -> None:
        parts = urlsplit(self.otlp_endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"tracing.otlp_endpoint {self.otlp_endpoint!r} is not an http:// or "
                             "https:// URL with a host (e.g. http://127.0.0.1:4317)")
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise ValueError(f"tracing.sample_ratio must be in [0, 1], got {self.sample_ratio}")
        if self.export_timeout_sec <= 0:
            raise ValueError("tracing.export_timeout_sec must be > 0")
        if self.enabled and not otel_available():
            raise ValueError(MISSING_EXTRA)


def valid_traceparent(value: str) -> bool:
    m = _TRACEPARENT.match(value)
    if m is None:
        return False
    version, trace_id, parent_id, _ = m.groups()
    return version != "ff" and trace_id != "0" * 32 and parent_id != "0" * 16


def carrier_from(headers: Mapping[str, str] | Iterable[tuple[str, Any]]) -> Carrier:
    """The valid trace headers among *headers* (HTTP headers, case-insensitive; or gRPC metadata
    pairs); empty when there is no valid ``traceparent``."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    parent = state = None
    for k, v in items:
        if not isinstance(v, str):
            continue
        name = k.lower()
        if name == TRACEPARENT and parent is None:
            parent = v.strip()
        elif name == TRACESTATE and state is None:
            state = v.strip()
    if parent is None or not valid_traceparent(parent):
        return ()
    if state and len(state) <= _TRACESTATE_MAX and _TRACESTATE_CHARS.match(state):
        return ((TRACEPARENT, parent), (TRACESTATE, state))
    return ((TRACEPARENT, parent),)


def trace_id_of(carrier: Carrier) -> str | None:
    for k, v in carrier:
        if k == TRACEPARENT:
            return v.split("-")[1]
    return None


class Span(Protocol):
    """One unit of work. ``carrier``: the trace headers to send to the next hop it calls."""

    @property
    def carrier(self) -> Carrier: ...

    @property
    def recording(self) -> bool: ...

    def set(self, key: str, value: AttrValue) -> None: ...

    def event(self, name: str, attrs: Mapping[str, AttrValue] | None = None) -> None: ...

    def fail(self, description: str) -> None:
        """Mark the span failed (ERROR status) with a short, bounded *description*."""
        ...

    def end(self) -> None: ...


class PassthroughSpan:
    """Tracing off: no span; the incoming carrier is what goes downstream."""

    __slots__ = ("carrier",)
    recording = False

    def __init__(self, carrier: Carrier) -> None:
        self.carrier = carrier

    def set(self, key: str, value: AttrValue) -> None:
        pass

    def event(self, name: str, attrs: Mapping[str, AttrValue] | None = None) -> None:
        pass

    def fail(self, description: str) -> None:
        pass

    def end(self) -> None:
        pass


Parent = Span | Carrier


class Tracer:
    """Tracing off: every span is a :class:`PassthroughSpan` of its parent's carrier."""

    enabled = False

    def start(self, name: str, parent: Parent, *, kind: Kind = "internal",
              attrs: Mapping[str, AttrValue] | None = None) -> Span:
        return PassthroughSpan(parent if isinstance(parent, tuple) else parent.carrier)

    @contextmanager
    def span(self, name: str, parent: Parent, *, kind: Kind = "internal",
             attrs: Mapping[str, AttrValue] | None = None) -> Iterator[Span]:
        """:meth:`start` … ``end``; an exception leaving the block marks the span failed."""
        s = self.start(name, parent, kind=kind, attrs=attrs)
        try:
            yield s
        except BaseException as exc:
            s.fail(type(exc).__name__)
            raise
        finally:
            s.end()

    def shutdown(self) -> None:
        pass


_tracer: Tracer = Tracer()
# The span (tracing on) or carrier (off) of the request this task serves: set by the HTTP front's
# middleware, read by what it calls (the gRPC Dispatch client, the in-process dispatch).
incoming: ContextVar[Parent] = ContextVar("motor_trace_incoming", default=())


def tracer() -> Tracer:
    return _tracer


def current_carrier() -> Carrier:
    """The trace headers the current request sends downstream."""
    parent = incoming.get()
    return parent if isinstance(parent, tuple) else parent.carrier


def setup_tracing(cfg: TracingConfig, service: str, *, exporter: Any = None) -> Tracer:
    """Install this process's tracer (once, at start-up; again in tests). With *exporter* (an
    OpenTelemetry ``SpanExporter``, e.g. the SDK's in-memory one) spans go there synchronously
    instead of to ``cfg.otlp_endpoint``."""
    global _tracer
    _tracer.shutdown()
    if not cfg.enabled and exporter is None:
        _tracer = Tracer()
        return _tracer
    if not otel_available():
        from motor_common.errors import ConfigError
        raise ConfigError(MISSING_EXTRA)
    from motor_common._otel import OtelTracer
    _tracer = OtelTracer(cfg, service, exporter)
    return _tracer


def reset_tracing() -> None:
    """Back to tracing off (flushes and stops an installed tracer)."""
    global _tracer
    _tracer.shutdown()
    _tracer = Tracer()
