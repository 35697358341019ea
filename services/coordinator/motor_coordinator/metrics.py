"""The dispatch path's Prometheus metrics (served on ``server.metrics_port``)."""

from __future__ import annotations

from prometheus_client import Counter

POISON_REQUESTS = Counter(
    "motor_coordinator_poison_requests",
    "Requests not sent to another engine because their engine hung or died while serving them "
    "(poison-request containment)",
    ["model"],
)
ENGINE_STALLS = Counter(
    "motor_coordinator_engine_stalls",
    "Attempts that got no first byte while their engine gave no sign of life for "
    "dispatch.first_byte_timeout_sec",
    ["role"],
)
PROBE_FAILURES = Counter(
    "motor_coordinator_health_probe_failures",
    "Health probes of an engine endpoint that got no passing answer",
    ["endpoint"],
)
MIGRATIONS = Counter(
    "motor_coordinator_migrations",
    "Requests continued on another engine after theirs died mid-answer (dispatch.migration_budget)",
    ["model"],
)
POLICY_DECISIONS = Counter(
    "motor_coordinator_policy_decisions",
    "Scheduling decisions by policy, role and outcome: routed (a request's first choice), "
    "retry_pick (another endpoint chosen for a retry), no_candidate (nothing schedulable for the role)",
    ["policy", "role", "outcome"],
)
