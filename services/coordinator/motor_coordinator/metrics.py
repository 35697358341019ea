"""The dispatch path's Prometheus metrics (served on ``server.metrics_port``)."""

from __future__ import annotations

from prometheus_client import Counter

POISON_REQUESTS = Counter(
    "motor_coordinator_poison_requests",
    "Requests not sent to another engine because their engine hung or died while serving them "
    "(poison-request containment)",
    ["model"],
)
POISON_SUSPECTS = Counter(
    "motor_coordinator_poison_suspects",
    "Requests on an engine when it stopped answering (poison suspects), by what became of them: "
    "paroled (sent to another engine, one per hung engine at a time), cleared (answered there: a "
    "victim), convicted (that engine stopped answering too: refused as poison), exonerated (a "
    "request convicted for the same hang was on the engine: retried as a victim), refused (not "
    "paroled: dispatch.parole_suspects off, paroled once already, or no turn in time)",
    ["model", "outcome"],
)
ENGINE_STALLS = Counter(
    "motor_coordinator_engine_stalls",
    "Attempts that got no first byte while their engine gave no sign of life for "
    "dispatch.first_byte_timeout_sec",
    ["role"],
)
STREAM_STALLS = Counter(
    "motor_coordinator_stream_stalls",
    "Answers whose engine stopped sending mid-answer and gave no sign of life for "
    "dispatch.inter_token_timeout_sec (continued elsewhere when the request can be migrated)",
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
    "retry_pick (another endpoint chosen for a retry), no_candidate (nothing schedulable for the role), "
    "decode_only (a vLLM decode takes a request whole: no prefill schedulable), "
    "prefill_only (a vLLM prefill takes a request whole: no decode schedulable, or its decodes unreachable)",
    ["policy", "role", "outcome"],
)
