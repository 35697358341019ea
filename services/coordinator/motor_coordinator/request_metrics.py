"""Per-request metrics of the dispatch path, named as vLLM names its own (``vllm:`` becomes
``motor_coordinator_``): outcome counts, time to first token, inter-token latency, end-to-end
latency, requests in flight. Labels ``model`` (only a model the coordinator routed to an engine;
anything else is ``none``, so a client cannot grow the label set) and ``mode`` (``pd`` or
``union``, from the answer's head).

:func:`observed` wraps a dispatcher's frame stream; both callers (the gRPC Dispatch service and
the co-located HTTP front) use it, so a request is counted once whichever way it came.
"""

from __future__ import annotations

import time
from asyncio import CancelledError
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from motor_coordinator.dispatcher import Frame, Head

# vLLM's buckets (vllm/v1/metrics/loggers.py), with finer low ends for a fast simulator
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
               0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
               40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

REQUESTS = Counter(
    "motor_coordinator_requests",
    "Requests dispatched, by model, mode (pd, union) and outcome: success (2xx answered to the "
    "end), engine_error (the engine answered 4xx/5xx), failed (no answer or broken off), "
    "cancelled (the client went away)",
    ["model", "mode", "outcome"],
)
TTFT = Histogram(
    "motor_coordinator_time_to_first_token_seconds",
    "Streaming requests: time from dispatch to the first body chunk (first token) relayed",
    ["model", "mode"], buckets=TTFT_BUCKETS,
)
ITL = Histogram(
    "motor_coordinator_inter_token_latency_seconds",
    "Streaming requests: time between successive body chunks relayed (a chunk is what one read "
    "from the engine delivered: one token, or several when they arrived together)",
    ["model", "mode"], buckets=ITL_BUCKETS,
)
E2E = Histogram(
    "motor_coordinator_e2e_request_latency_seconds",
    "Time from dispatch to the end of the answer (whole stream), successful requests",
    ["model", "mode"], buckets=E2E_BUCKETS,
)
IN_FLIGHT = Gauge(
    "motor_coordinator_requests_in_flight",
    "Requests being dispatched now (before their model is known to be served: model=\"none\")",
    ["model"],
)

NO_MODEL = "none"
_SSE = "text/event-stream"

# The labelled children, looked up once per label set (prometheus_client's labels() takes a lock
# and builds the key on every call: several per request, one per streamed chunk). The label sets
# are served models x modes x outcomes, as bounded as the metrics' own.
_CHILDREN: dict[tuple[Any, ...], Any] = {}


def _child(metric: Any, *labels: str) -> Any:
    key = (metric, *labels)
    child = _CHILDREN.get(key)
    if child is None:
        child = _CHILDREN[key] = metric.labels(*labels)
    return child


async def observed(frames: AsyncIterator[Frame], model: str) -> AsyncIterator[Frame]:
    """*frames* unchanged, with the request's metrics recorded as they pass."""
    start = time.perf_counter()
    label, mode = NO_MODEL, "none"
    streaming = False
    last: float | None = None
    outcome = "failed"
    in_flight = _child(IN_FLIGHT, NO_MODEL)
    itl = None
    in_flight.inc()
    try:
        async for frame in frames:
            if isinstance(frame, Head):
                in_flight.dec()
                label = model
                mode = "pd" if frame.prefill_instance_id else "union"
                in_flight = _child(IN_FLIGHT, label)
                in_flight.inc()
                streaming = frame.content_type.startswith(_SSE) and frame.http_status < 400
                outcome = "success" if frame.http_status < 400 else "engine_error"
            elif streaming and frame:
                now = time.perf_counter()
                if last is None:
                    _child(TTFT, label, mode).observe(now - start)
                else:
                    if itl is None:
                        itl = _child(ITL, label, mode)
                    itl.observe(now - last)
                last = now
            yield frame
    except GeneratorExit:
        outcome = "cancelled"
        raise
    except BaseException as exc:
        outcome = "cancelled" if isinstance(exc, CancelledError) else "failed"
        raise
    finally:
        in_flight.dec()
        _child(REQUESTS, label, mode, outcome).inc()
        if outcome == "success":
            _child(E2E, label, mode).observe(time.perf_counter() - start)
