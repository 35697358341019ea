"""Prometheus metrics of the OpenAI HTTP front (``motor-gateway`` and the co-located front; the
``motor_gateway_*`` names are the same for both).

Gauges sum over the live processes in Prometheus multiprocess mode (``motor-gateway`` with
``workers`` > 1: ``motor_common.worker_supervisor``).

Created unregistered and added to the process-wide default registry by :func:`register` when an
HTTP front is built (``motor_common.openai_front.app.Gateway``): a coordinator without a co-located front
imports this module but exposes no empty ``motor_gateway_*`` families.
"""

from __future__ import annotations

import threading

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

REQUESTS = Counter(
    "motor_gateway_requests_total",
    "HTTP requests answered by the gateway, by route and status.",
    ["route", "status"],
    registry=None,
)
LATENCY = Histogram(
    "motor_gateway_request_seconds",
    "Time from request to the end of the response (whole stream for SSE), by route.",
    ["route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
    registry=None,
)
IN_FLIGHT = Gauge(
    "motor_gateway_requests_in_flight",
    "HTTP requests being served, by route.",
    ["route"],
    registry=None,
    multiprocess_mode="livesum",
)
CONNECTIONS_REFUSED = Counter(
    "motor_gateway_connections_refused_total",
    "Client connections answered 503 and closed because limits.max_connections were open.",
    registry=None,
)
ADMITTED = Counter(
    "motor_gateway_admission_admitted_total",
    "Requests admitted to the engines (at once or after waiting in the admission queue).",
    registry=None,
)
QUEUED_TOTAL = Counter(
    "motor_gateway_admission_queued_total",
    "Requests that had to wait in the admission queue.",
    registry=None,
)
SHED = Counter(
    "motor_gateway_admission_shed_total",
    "Requests refused with 429 by admission control, by reason (queue_full, queue_timeout, buffered_bytes).",
    ["reason"],
    registry=None,
)
QUEUED = Gauge(
    "motor_gateway_admission_queue_length",
    "Requests waiting in the admission queue now.",
    registry=None,
    multiprocess_mode="livesum",
)
ADMITTED_IN_FLIGHT = Gauge(
    "motor_gateway_admission_in_flight",
    "Admitted requests being served now.",
    registry=None,
    multiprocess_mode="livesum",
)

_ALL = (REQUESTS, LATENCY, IN_FLIGHT, CONNECTIONS_REFUSED, ADMITTED, QUEUED_TOTAL, SHED, QUEUED,
        ADMITTED_IN_FLIGHT)
_registered = False
_lock = threading.Lock()


def register() -> None:
    """Add the gateway's metrics to the default registry (once per process)."""
    global _registered
    with _lock:
        if not _registered:
            for metric in _ALL:
                REGISTRY.register(metric)
            _registered = True
