"""Coordinator configuration: frozen dataclasses loaded by ``motor_common.config.load_config``.

Unknown keys are rejected by the loader (exit 2 naming the key). HA (active/standby through an
etcd lease, docs/ha.md) is on when ``ha.etcd_endpoints`` is set; standalone coordinators ignore
the HA keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from motor_common import ports
from motor_common.grpc_server import ServerConfig
from motor_common.kv_events import DEFAULT_VLLM_SEED
from motor_common.logs import LogConfig
from motor_common.openai_front.admission import AdmissionConfig
from motor_common.openai_front.limits import HttpLimits
from motor_common.tls import TlsConfig
from motor_common.tracing import TracingConfig
from motor_common.worker_policy import admission_too_small
from motor_coordinator.precision_config import PrecisionConfig

ENV_PREFIX = "MOTOR_COORDINATOR"


@dataclass(frozen=True)
class KvEventsConfig:
    """The ``kv_events`` policy (docs/kv-events.md): the coordinator subscribes to the KV-cache
    events of every prefill/union endpoint that announces a ``kv_events_port``."""

    # Token ids of text/chat prompts: "none" (only prompts given as ids are hashed; the others
    # go by the ring), "simulator" (motor-sim's tokenizer and chat template: exact for motor-sim)
    # or "hf" (the Hugging Face tokenizer and chat template in tokenizer_path: real vLLM/SGLang;
    # needs the motor-pd[tokenizers] extra).
    tokenizer: Literal["none", "simulator", "hf"] = "none"
    # tokenizer "hf": the served model's local directory (tokenizer.json, tokenizer_config.json,
    # chat template), or its tokenizer.json. Read once at start-up; nothing is downloaded.
    tokenizer_path: str = ""
    # tokenizer "hf" in a fleet of several models: model name -> that model's directory (or
    # tokenizer.json). A listed model uses its own; the others use tokenizer_path, or, without
    # one, get no ids (the ring decides for them).
    tokenizer_paths: dict[str, str] = field(default_factory=dict)
    # The engines' --block-size (vLLM) / --page-size (SGLang), in tokens, until a model's engines
    # report theirs in a BlockStored event (then that one, per model).
    block_size: int = 16
    # vLLM's hash seed (PYTHONHASHSEED of the engines; vLLM's default when unset).
    hash_seed: str = DEFAULT_VLLM_SEED
    # vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (its default 1): hashes travel as 64-bit ints.
    int_hashes: bool = True
    # Prompt tokens hashed at most (leading blocks only; bounds the work per request).
    max_prompt_tokens: int = 8192
    # Block hashes remembered per engine (least recently stored dropped first).
    max_blocks_per_engine: int = 200_000
    # Deadline of each message of a replay (catch-up after a reconnect or a gap).
    replay_timeout_sec: float = 2.0
    # An engine sent a prefill that stores new blocks and silent this long since: stale (holding
    # nothing) until it publishes again; 0 = never (trust a silent publisher).
    silence_timeout_sec: float = 30.0

    def __post_init__(self) -> None:
        if not 1 <= self.block_size <= 4096:
            raise ValueError("scheduler.kv_events.block_size must be in [1, 4096]")
        if not 1 <= self.max_prompt_tokens <= 1_000_000:
            raise ValueError("scheduler.kv_events.max_prompt_tokens must be in [1, 1000000]")
        if self.max_blocks_per_engine < 1:
            raise ValueError("scheduler.kv_events.max_blocks_per_engine must be >= 1")
        if self.replay_timeout_sec <= 0:
            raise ValueError("scheduler.kv_events.replay_timeout_sec must be > 0")
        if self.tokenizer == "hf" and not self.tokenizer_path and not self.tokenizer_paths:
            raise ValueError("scheduler.kv_events.tokenizer_path must name the model's tokenizer "
                             "directory (or tokenizer.json) when tokenizer is 'hf' (or tokenizer_paths "
                             "each model's)")
        if self.tokenizer != "hf" and (self.tokenizer_path or self.tokenizer_paths):
            raise ValueError("scheduler.kv_events.tokenizer_path and tokenizer_paths are only used with tokenizer 'hf'")
        for model, path in self.tokenizer_paths.items():
            if not model or not path:
                raise ValueError("scheduler.kv_events.tokenizer_paths maps a model name to its tokenizer "
                                 f"directory; got {model!r}: {path!r}")
        if self.silence_timeout_sec < 0:
            raise ValueError("scheduler.kv_events.silence_timeout_sec must be >= 0 (0: never)")


@dataclass(frozen=True)
class SchedulerConfig:
    # One of motor_coordinator.policies.POLICIES; unknown name = start-up error.
    policy: str = "least_load"
    # prefix_aware: characters of the rendered prompt hashed to choose the prefill endpoint.
    prefix_chars: int = 256
    # prefix_aware: the preferred endpoint is abandoned for the least loaded one when its load
    # exceeds the least loaded endpoint's by more than this many requests.
    prefix_load_slack: float = 4.0
    # least_load: weight of the engine's KV-cache usage (0..1) in the load score.
    kv_usage_weight: float = 4.0
    # kv_events: where the KV events come from and how prompts are hashed.
    kv_events: KvEventsConfig = field(default_factory=KvEventsConfig)
    # While no prefill is schedulable for a model, send its requests whole to a vLLM decode, which
    # computes the prompt itself (slower, but served), instead of refusing them with 503. SGLang
    # decodes cannot: they wait for a prefill's KV.
    decode_only_fallback: bool = True
    # While no decode is schedulable for a model, send its requests whole to a vLLM prefill, which
    # then decodes too (its prefill work waits meanwhile), instead of refusing them with 503; also
    # a request whose decodes were all unreachable after its prefill answered. SGLang prefills
    # cannot: they hand their KV to a decode.
    prefill_only_fallback: bool = True

    def __post_init__(self) -> None:
        if self.prefix_chars < 1:
            raise ValueError("scheduler.prefix_chars must be >= 1")
        if self.prefix_load_slack < 0 or self.kv_usage_weight < 0:
            raise ValueError("scheduler.prefix_load_slack and kv_usage_weight must be >= 0")


@dataclass(frozen=True)
class DispatchConfig:
    # Whole-request bound (also capped by the gRPC deadline).
    request_timeout_sec: float = 600.0
    # Extra prefill attempts on other prefill endpoints after a connect error or 5xx.
    prefill_retries: int = 2
    # Extra decode attempts on other decode endpoints after a connect error (before any byte
    # reached the client).
    decode_retries: int = 2
    # Extra prefill→decode hand-offs after a decode answered that it could not load the prefill's
    # KV (vLLM: NIXL handshake/transfer failed; before any byte reached the client).
    kv_load_retries: int = 2
    connect_timeout_sec: float = 3.0
    # An idle connection to an engine is reused for at most this long. Keep it below the engines'
    # own keep-alive (vLLM: VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s; SGLang: uvicorn's default, 5 s):
    # a request written to a connection the engine is closing fails as a dropped connection (after
    # a pause of this process, the close may not have been read yet when the request is sent).
    engine_keepalive_sec: float = 2.0
    # An attempt that has no first byte while its engine has given no sign of life (no answer to
    # any request, health probe or metrics scrape) for this long has stalled on a hung engine: it
    # is failed over to another engine, or refused as a poison suspect (docs/fault-tolerance.md).
    # Keep it above health_probe_interval_sec + probe_timeout_sec; an engine that is merely slow
    # on a long prefill still answers its probes and is waited for.
    first_byte_timeout_sec: float = 5.0
    # false (default): the requests an engine was serving when it stopped answering (poison
    # suspects) are refused at once - a poison request never reaches a second engine, but the
    # innocent requests of a frozen engine fail with it. true: they are sent to another engine one
    # at a time, and one that stalls a second engine is refused as poison - the frozen engine's
    # requests are served, but a poison takes down two engines (with two of a role: all of them)
    # before it is refused. docs/fault-tolerance.md.
    parole_suspects: bool = False
    # A stream whose engine has given no sign of life (no chunk, answer, probe or scrape) for this
    # long since its last chunk has stalled: it is continued on another engine like a broken one
    # (mid-stream migration), or ended with an error when it cannot be continued. Keep it above
    # health_probe_interval_sec + probe_timeout_sec: a live engine is waited for.
    inter_token_timeout_sec: float = 5.0
    # Continuations per request when its engine dies after the response head: a stream goes on
    # on another engine (prompt + the text already sent, re-prefilled), a non-streamed answer is
    # run again; 0 = off (docs/fault-tolerance.md, mid-stream migration).
    migration_budget: int = 1
    # Background GET /health of every registered endpoint; 0 disables probing.
    health_probe_interval_sec: float = 1.0
    # Timeout of one health probe or metrics scrape.
    probe_timeout_sec: float = 1.0
    # Consecutive failures (requests or probes) that take an endpoint out of rotation.
    circuit_breaker_failures: int = 3
    # Minimum time an endpoint stays out of rotation before a passing probe restores it.
    circuit_breaker_cooldown_sec: float = 1.0
    # Background scrape of engines' /metrics for least_load; 0 disables scraping.
    metrics_scrape_interval_sec: float = 1.0

    def __post_init__(self) -> None:
        if min(self.request_timeout_sec, self.connect_timeout_sec, self.probe_timeout_sec,
               self.first_byte_timeout_sec, self.inter_token_timeout_sec, self.engine_keepalive_sec) <= 0:
            raise ValueError("dispatch timeouts must be > 0")
        if self.prefill_retries < 0:
            raise ValueError("dispatch.prefill_retries must be >= 0")
        if self.migration_budget < 0:
            raise ValueError("dispatch.migration_budget must be >= 0")
        if self.decode_retries < 0:
            raise ValueError("dispatch.decode_retries must be >= 0")
        if self.kv_load_retries < 0:
            raise ValueError("dispatch.kv_load_retries must be >= 0")
        if self.circuit_breaker_failures < 1:
            raise ValueError("dispatch.circuit_breaker_failures must be >= 1")
        if min(self.health_probe_interval_sec, self.metrics_scrape_interval_sec,
               self.circuit_breaker_cooldown_sec) < 0:
            raise ValueError("dispatch intervals must be >= 0")


@dataclass(frozen=True)
class HaConfig:
    # etcd client endpoints (host:port); empty = standalone (no election).
    etcd_endpoints: tuple[str, ...] = ()
    # The lock key every coordinator of one deployment campaigns for.
    election_key: str = "/motor/coordinator/leader"
    # This coordinator's gRPC address as peers reach it (gateway, controller); default
    # server.host:<bound port>. Announced in the promotion alarm.
    advertise_address: str | None = None
    # Value written under the lock key; default the advertise address.
    candidate_id: str | None = None
    # Kubernetes mode: exit non-zero (75) when the lock is lost, so the pod leaves the Service.
    exit_on_lost: bool = False
    # Timeout of one etcd call (capped at master_lock_ttl / 3).
    etcd_call_timeout_sec: float = 1.0
    # A coordinator whose instance registry the controller has not synced yet (just started or
    # restarted) does not take a free master lock for up to this many seconds after its start, so a
    # synced standby wins the failover instead of a peer that would answer REGISTRY_NOT_SYNCED
    # until the controller's next sync (0: campaign at once). Once synced it campaigns at once.
    unsynced_campaign_delay_sec: float = 10.0

    @property
    def enabled(self) -> bool:
        return bool(self.etcd_endpoints)

    def __post_init__(self) -> None:
        if not self.election_key.strip():
            raise ValueError("ha.election_key must not be empty")
        for ep in self.etcd_endpoints:
            if ":" not in ep:
                raise ValueError(f"ha.etcd_endpoints: {ep!r} is not host:port")
        if self.etcd_call_timeout_sec <= 0:
            raise ValueError("ha.etcd_call_timeout_sec must be > 0")
        if not 0 <= self.unsynced_campaign_delay_sec <= 300:
            raise ValueError("ha.unsynced_campaign_delay_sec must be between 0 and 300")


@dataclass(frozen=True)
class HttpConfig:
    """The co-located OpenAI front (docs/coordinator.md): the gateway's routes served by this
    process, dispatching in process. Off unless ``port`` is set (0 = any free port)."""

    host: str = "127.0.0.1"
    port: int | None = None
    # File holding the inference API key; when set, /v1/* needs `Authorization: Bearer <key>`.
    api_key_file: str | None = None
    # Seconds in-flight HTTP requests get to finish on shutdown.
    shutdown_grace_sec: float = 10.0
    # HTTPS (motor_common.tls): cert_file/key_file served and reloaded on change; plain HTTP when unset.
    tls: TlsConfig = field(default_factory=TlsConfig)
    # The same bounds on clients as motor-gateway's `limits` section (docs/security.md).
    limits: HttpLimits = field(default_factory=HttpLimits)
    # Admission control of the front (motor-gateway's `admission` section). With workers > 1 the
    # request counts are the whole front's, split over the workers; the byte bounds are per worker.
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    # Front worker processes sharing http.port (SO_REUSEPORT), each dispatching with its own copy
    # of the instance set and the others' load (front_worker.py, docs/coordinator.md). 1 = serve
    # in the coordinator process itself.
    workers: int = 1
    # With workers > 1: a worker whose event loop sent no heartbeat for this long is killed and
    # restarted.
    worker_liveness_timeout_sec: float = 10.0

    @property
    def enabled(self) -> bool:
        return self.port is not None

    def __post_init__(self) -> None:
        if self.port is not None and not 0 <= self.port <= 65535:
            raise ValueError(f"http.port {self.port} is outside [0, 65535]")
        if not 1 <= self.workers <= 64:
            raise ValueError(f"http.workers must be in [1, 64], got {self.workers}")
        if self.workers > 1 and self.port is None:
            raise ValueError(f"http.workers {self.workers} needs the co-located front: set http.port "
                             "(or --http-port)")
        too_small = admission_too_small(self.admission, self.workers)
        if too_small is not None:
            raise ValueError(f"http.{too_small}")
        if not 2.0 <= self.worker_liveness_timeout_sec <= 3600:
            raise ValueError("http.worker_liveness_timeout_sec must be in [2, 3600] seconds (heartbeats "
                             f"come every second), got {self.worker_liveness_timeout_sec}")


@dataclass(frozen=True)
class CoordinatorConfig:
    server: ServerConfig = field(default_factory=lambda: ServerConfig(port=ports.COORDINATOR_GRPC))
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    log: LogConfig = field(default_factory=LogConfig)
    # Active/standby HA (SPEC §3.4 / §6 names). Clamped at run time to ≤ 8 s and ≤ 2 s (logged).
    # 3 s / 0.5 s: a dead master's lease expires ≤ 3 s after its last renewal (renewals every 1 s,
    # so two lost renewals are survived), the standby notices within 0.5 s: failover ≤ 3.5 s + the
    # gateway's probe interval, inside the 5 s target. etcd's minimum lease TTL is 2 s.
    master_lock_ttl: float = 3.0
    master_standby_check_interval: float = 0.5
    ha: HaConfig = field(default_factory=HaConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    # Controller gRPC address for the promotion alarm (ReportAlarm); unset = no announcement.
    controller_address: str | None = None
    # Precision alarms (SPEC §3.5, docs/precision.md): consecutive normal samples that clear an alarm.
    precision_clear_threshold: int = 10
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    # OpenTelemetry spans and their OTLP export (the otel extra); off: traceparent only passed on.
    tracing: TracingConfig = field(default_factory=TracingConfig)

    def __post_init__(self) -> None:
        if self.master_lock_ttl <= 0 or self.master_standby_check_interval <= 0:
            raise ValueError("master_lock_ttl and master_standby_check_interval must be > 0")
        if self.precision_clear_threshold < 1:
            raise ValueError("precision_clear_threshold must be >= 1")
        if self.ha.enabled and not self.ha.advertise_address and self.server.host.strip("[]") in ("", "0.0.0.0", "::"):
            # The default advertise address would be "0.0.0.0:<port>": the same id for every
            # coordinator in the election, and an address the controller cannot reach.
            raise ValueError(f"ha.advertise_address must be set when server.host is the wildcard {self.server.host!r}: "
                             "it is this coordinator's id in the election and the address it announces to the "
                             "controller (e.g. <this host's IP>:<port>)")
