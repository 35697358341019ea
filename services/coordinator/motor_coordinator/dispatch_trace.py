"""What one dispatched request's engine calls show: spans (``motor_common.tracing``) and the PD
phase, retry and failover metrics. The dispatcher makes one :class:`DispatchTrace` per request
and one :class:`EngineCall` per request it sends to an engine; it decides, this module records.

Spans of one PD request (tracing on), each a child of the one before it::

    coordinator.dispatch                  (child of the gateway's request span, over gRPC)
      prefill          client; its traceparent is sent to the prefill engine
      decode           client; its traceparent is sent to the decode engine
        kv_handoff     decode sent → its first body byte (the decode loads the KV, makes a token)
        decode_stream  first body byte → last

A failed attempt ends ``ERROR`` with the reason, and the next attempt (``motor.attempt`` 2, 3…)
follows it; the dispatch span gets a ``retry`` event per retry and a ``migration`` event per
mid-stream continuation. A union request has one ``union`` client span.

Metrics (``model`` is always a model the scheduler routed, so the label set is bounded):

* ``motor_coordinator_pd_phase_duration_seconds{model,role,phase}``: ``prefill`` (role prefill:
  prefill sent → its whole answer), ``decode_first_byte`` (role decode: decode sent → first body
  byte) and ``kv_handoff`` (role decode: the prefill's answer, i.e. its KV is ready → the decode's
  first body byte; vLLM's decode pulls the KV before it makes that token). Successful phases only.
* ``motor_coordinator_retries_total{model,role,reason}``: a request sent again before the client
  saw a byte; reason ``unreachable`` (no connection, dropped, or stalled), ``engine_error``
  (prefill answered 5xx) or ``kv_handoff_failed`` (the decode could not load the KV).
* ``motor_coordinator_failovers_total{model,role,reason}``: those retries that went to another
  engine than the one that failed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from prometheus_client import Counter, Histogram

from motor_common.tracing import AttrValue, Carrier, Parent, Span, tracer
from motor_coordinator.policies import Candidate

RetryReason = Literal["unreachable", "engine_error", "kv_handoff_failed"]

# request_metrics.TTFT_BUCKETS (vLLM's time-to-first-token buckets with finer low ends)
PHASE_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)

PHASE = Histogram(
    "motor_coordinator_pd_phase_duration_seconds",
    "PD phases of successful requests: prefill (prefill sent -> whole answer), decode_first_byte "
    "(decode sent -> first body byte), kv_handoff (prefill answered -> the decode's first body byte)",
    ["model", "role", "phase"], buckets=PHASE_BUCKETS,
)
RETRIES = Counter(
    "motor_coordinator_retries",
    "Engine requests sent again before the client saw a byte, by role and reason "
    "(unreachable, engine_error, kv_handoff_failed)",
    ["model", "role", "reason"],
)
FAILOVERS = Counter(
    "motor_coordinator_failovers",
    "Retries that went to another engine than the one that failed, by role and reason",
    ["model", "role", "reason"],
)


# Labelled children, resolved once per label set (``labels()`` takes a lock and builds a key on
# every call); bounded as the label values are (routed models x fixed phases).
_PHASES: dict[tuple[str, str, str], Any] = {}


def _observe_phase(model: str, role: str, phase: str, seconds: float) -> None:
    child = _PHASES.get((model, role, phase))
    if child is None:
        child = _PHASES[(model, role, phase)] = PHASE.labels(model, role, phase)
    child.observe(seconds)


class EngineCall:
    """One request to one engine (an attempt). ``carrier``: the trace headers it is sent with."""

    __slots__ = ("_kv", "_stream", "_trace", "cand", "first_at", "role", "sent", "span")

    def __init__(self, trace: DispatchTrace, role: str, cand: Candidate, attempt: int) -> None:
        self._trace = trace
        self.role = role
        self.cand = cand
        ep = cand.endpoint
        tr = tracer()
        attrs: dict[str, AttrValue] | None = None
        if tr.enabled:  # no attribute dict per engine call when tracing is off
            attrs = {"motor.role": role, "motor.instance_id": cand.instance.id, "server.address": ep.ip,
                     "server.port": ep.business_port, "motor.attempt": attempt}
        self.span = tr.start(role, trace.span, kind="client", attrs=attrs)
        self._kv: Span | None = tr.start("kv_handoff", self.span) if role == "decode" else None
        self._stream: Span | None = None
        self.sent = time.perf_counter()
        self.first_at: float | None = None

    @property
    def carrier(self) -> Carrier:
        return self.span.carrier

    def answered(self, status: int) -> None:
        """A whole answer (prefill) arrived with HTTP *status*."""
        self.span.set("http.response.status_code", status)
        if status == 200 and self.role == "prefill":
            now = time.perf_counter()
            self._trace.prefill_at = now
            _observe_phase(self._trace.model, "prefill", "prefill", now - self.sent)
        if status >= 500:
            self.span.fail(f"HTTP {status}")
        self.end()

    def head(self, status: int) -> None:
        """The answer's head arrived (it is relayed next)."""
        self.span.set("http.response.status_code", status)
        if status >= 500:
            self.span.fail(f"HTTP {status}")

    def first_byte(self) -> None:
        """The first body bytes of a streamed or relayed answer reached the coordinator."""
        if self.first_at is not None:
            return
        now = self.first_at = time.perf_counter()
        if self.role == "decode":
            t = self._trace
            _observe_phase(t.model, "decode", "decode_first_byte", now - self.sent)
            if t.prefill_at is not None and t.prefill_at <= now:
                _observe_phase(t.model, "decode", "kv_handoff", now - t.prefill_at)
            if self._kv is not None:
                self._kv.end()
                self._kv = None
            self._stream = tracer().start("decode_stream", self.span)

    def fail(self, reason: str) -> None:
        self.span.fail(reason)
        for s in (self._kv, self._stream):
            if s is not None:
                s.fail(reason)
        self.end()

    def end(self) -> None:
        for s in (self._kv, self._stream):
            if s is not None:
                s.end()
        self._kv = self._stream = None
        if self in self._trace.calls:
            self._trace.calls.remove(self)
            self.span.end()


class DispatchTrace:
    """One request through the dispatcher: its span, its engine calls, its retries."""

    __slots__ = ("_attempts", "calls", "model", "prefill_at", "span")

    def __init__(self, model: str, request_id: str, parent: Parent, *, stream: bool) -> None:
        self.model = model
        # Over gRPC the parent is the carrier from the metadata (this is the server side of the
        # hop); in the co-located front it is the gateway's span in this process.
        self.span = tracer().start("coordinator.dispatch", parent,
                                   kind="server" if isinstance(parent, tuple) else "internal",
                                   attrs={"motor.request_id": request_id, "gen_ai.request.model": model,
                                          "motor.stream": stream})
        self.calls: list[EngineCall] = []
        self._attempts: dict[str, int] = {}
        self.prefill_at: float | None = None

    def call(self, role: str, cand: Candidate) -> EngineCall:
        n = self._attempts[role] = self._attempts.get(role, 0) + 1
        c = EngineCall(self, role, cand, n)
        self.calls.append(c)
        return c

    def retry(self, role: str, reason: RetryReason, failed: Candidate, nxt: Candidate | None) -> None:
        """The request is sent again to *nxt* (None: given up, nothing recorded) after *failed*
        failed for *reason*."""
        if nxt is None:
            return
        RETRIES.labels(self.model, role, reason).inc()
        other = nxt.endpoint.host_port != failed.endpoint.host_port
        if other:
            FAILOVERS.labels(self.model, role, reason).inc()
        attrs: dict[str, AttrValue] = {"motor.role": role, "motor.reason": reason, "motor.failover": other}
        self.span.event("retry", attrs)

    def migrated(self, migration: int) -> None:
        self.span.event("migration", {"motor.migration": migration})

    def end(self, error: BaseException | None = None) -> None:
        """The request is over: end what is still open (failed with *error*'s type, if any)."""
        for c in list(self.calls):
            if error is not None:
                c.fail(_why(error))
            else:
                c.end()
        if error is not None:
            self.span.fail(_why(error))
        self.span.end()


def _why(error: BaseException) -> str:
    """A failed request's span status: the client left, the MotorError reason, or the type."""
    if isinstance(error, GeneratorExit | asyncio.CancelledError):
        return "cancelled"
    return getattr(error, "reason", "") or type(error).__name__
