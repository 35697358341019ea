"""Gateway configuration (strict: unknown keys are rejected by ``motor_common.config``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from motor_common.logs import LogConfig
from motor_common.openai_front.admission import AdmissionConfig
from motor_common.openai_front.limits import HttpLimits
from motor_common.tls import TlsConfig
from motor_common.tracing import TracingConfig
from motor_common.worker_policy import admission_too_small

DEFAULT_COORDINATOR = "127.0.0.1:9100"


@dataclass(frozen=True)
class GatewayConfig:
    """``motor-gateway`` settings; env overrides use the prefix ``MOTOR_GATEWAY__``."""

    host: str = "127.0.0.1"
    port: int = 8000
    # Coordinator gRPC addresses (host:port), in order of preference; the first ready one serves.
    coordinators: tuple[str, ...] = (DEFAULT_COORDINATOR,)
    # Deadline of one Dispatch call (the whole response, streamed or not). A client that has not
    # taken its streamed answer by then (plus 2 s) has its connection closed.
    request_timeout_sec: float = 600.0
    # Deadline of the small coordinator calls (readiness, model list).
    control_timeout_sec: float = 3.0
    # Inference API keys: one bare key, or `name: key` lines (several named keys); re-read when
    # the file changes. When set, /v1/* needs `Authorization: Bearer <key>`.
    api_key_file: str | None = None
    # The gateway's own credential to the coordinators' DispatchService (one of their inference
    # keys); needed when the coordinators have inference keys (docs/security.md).
    coordinator_key_file: str | None = None
    # TLS to the coordinators (motor_common.tls): ca_file verifies them (TLS on when set),
    # cert_file/key_file are presented as the client certificate (mutual TLS).
    tls: TlsConfig = field(default_factory=TlsConfig)
    # Older spelling of tls.ca_file.
    tls_ca_file: str | None = None
    # HTTPS on the OpenAI front: cert_file/key_file served (reloaded when they change); with
    # require_client_cert, HTTP clients need a certificate signed by ca_file. Plain HTTP when unset.
    https: TlsConfig = field(default_factory=TlsConfig)
    # Seconds between readiness probes of the coordinators (only with more than one; all are
    # probed concurrently, each bounded by probe_timeout_sec). See docs/ha.md.
    probe_interval_sec: float = 0.25
    probe_timeout_sec: float = 0.5
    # How long a request waits for a master coordinator during a failover, and how many times a
    # request that failed before its first byte is sent (first try included).
    failover_timeout_sec: float = 10.0
    dispatch_attempts: int = 3
    # Requests travel on one long-lived DispatchMany stream per coordinator (the gRPC call's cost
    # paid once per connection); false = one Dispatch call per request. A coordinator without
    # DispatchMany (older version) gets Dispatch calls either way. docs/benchmarks.md has numbers.
    multiplex: bool = True
    # Seconds in-flight requests get to finish on SIGTERM/SIGINT.
    shutdown_grace_sec: float = 10.0
    # HTTP worker processes sharing the listening port (SO_REUSEPORT, kernel load-balanced),
    # supervised by this process (restarted when they die; docs/operations.md "Gateway worker processes",
    # motor_common/worker_supervisor.py); each holds its own coordinator channel,
    # and the coordinator keeps the scheduling state. 1 = serve in this process.
    workers: int = 1
    # With workers > 1: a worker whose event loop sent no heartbeat for this long is killed and
    # restarted (the kernel would keep handing a wedged worker connections).
    worker_liveness_timeout_sec: float = 10.0
    # Bounds on what clients send (body, headers, connections, slow clients): docs/security.md.
    limits: HttpLimits = field(default_factory=HttpLimits)
    # Bounded concurrency and queues per model and per API key, 429 beyond (docs/security.md).
    # With workers > 1 the request counts (max_in_flight_*, max_queued_*) are the whole front's,
    # split over the workers (a nonzero max_in_flight_* must be >= workers); the byte bounds
    # (max_in_flight_bytes, max_buffered_bytes) are per worker process.
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    log: LogConfig = field(default_factory=LogConfig)
    # OpenTelemetry spans and their OTLP export (the otel extra); off: traceparent only passed on.
    tracing: TracingConfig = field(default_factory=TracingConfig)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is outside [0, 65535]")
        if not self.coordinators:
            raise ValueError("coordinators: at least one coordinator address is needed")
        for addr in self.coordinators:
            if not addr or ":" not in addr:
                raise ValueError(f"coordinators: {addr!r} is not host:port")
        if not 1 <= self.workers <= 256:
            raise ValueError(f"workers must be in [1, 256], got {self.workers}")
        too_small = admission_too_small(self.admission, self.workers)
        if too_small is not None:
            raise ValueError(too_small)
        if not 2.0 <= self.worker_liveness_timeout_sec <= 3600:
            raise ValueError("worker_liveness_timeout_sec must be in [2, 3600] seconds (heartbeats "
                             f"come every second), got {self.worker_liveness_timeout_sec}")
        if self.request_timeout_sec <= 0 or self.control_timeout_sec <= 0:
            raise ValueError("request_timeout_sec and control_timeout_sec must be positive")
        # 0 probed every coordinator in a busy loop (a whole core); a 0 timeout fails every probe.
        if self.probe_interval_sec < 0.05 or self.probe_timeout_sec <= 0:
            raise ValueError(f"probe_interval_sec must be at least 0.05 and probe_timeout_sec positive, got "
                             f"{self.probe_interval_sec:g} and {self.probe_timeout_sec:g}")
        if self.dispatch_attempts < 1:  # was taken as 1 silently
            raise ValueError(f"dispatch_attempts must be at least 1 (the first try), got {self.dispatch_attempts}")
