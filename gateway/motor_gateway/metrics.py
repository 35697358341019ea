"""Prometheus metrics of the gateway (process-wide default registry)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Counter(
    "motor_gateway_requests_total",
    "HTTP requests answered by the gateway, by route and status.",
    ["route", "status"],
)
LATENCY = Histogram(
    "motor_gateway_request_seconds",
    "Time from request to the end of the response (whole stream for SSE), by route.",
    ["route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
IN_FLIGHT = Gauge(
    "motor_gateway_requests_in_flight",
    "HTTP requests being served, by route.",
    ["route"],
)
CONNECTIONS_REFUSED = Counter(
    "motor_gateway_connections_refused_total",
    "Client connections answered 503 and closed because limits.max_connections were open.",
)
ADMITTED = Counter(
    "motor_gateway_admission_admitted_total",
    "Requests admitted to the engines (at once or after waiting in the admission queue).",
)
QUEUED_TOTAL = Counter(
    "motor_gateway_admission_queued_total",
    "Requests that had to wait in the admission queue.",
)
SHED = Counter(
    "motor_gateway_admission_shed_total",
    "Requests refused with 429 by admission control, by reason (queue_full, queue_timeout, buffered_bytes).",
    ["reason"],
)
QUEUED = Gauge(
    "motor_gateway_admission_queue_length",
    "Requests waiting in the admission queue now.",
)
ADMITTED_IN_FLIGHT = Gauge(
    "motor_gateway_admission_in_flight",
    "Admitted requests being served now.",
)
