"""Simulator configuration: one frozen dataclass built by ``cli`` (pure, no I/O)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from motor_sim.costmodel import CostModel
from motor_sim.kv_events_pub import KvEventsConfig


class Flavour(enum.Enum):
    VLLM = "vllm"
    SGLANG = "sglang"


class Role(enum.Enum):
    """What the engine does in a PD deployment."""

    UNION = "union"  # serves whole requests (no connector / disaggregation-mode null)
    PREFILL = "prefill"  # vLLM kv_producer, SGLang disaggregation-mode prefill
    DECODE = "decode"  # vLLM kv_consumer, SGLang disaggregation-mode decode
    BOTH = "both"  # vLLM kv_both: may produce and consume


@dataclass(frozen=True)
class SimConfig:
    flavour: Flavour
    model: str
    served_model_names: tuple[str, ...]
    host: str = "0.0.0.0"
    port: int = 8000
    role: Role = Role.UNION
    kv_transfer_config: dict[str, object] | None = None
    # --kv-events-config: publish KV-cache events (None = off)
    kv_events: KvEventsConfig | None = None
    engine_id: str = ""
    # parallelism (reported, and used to derive ports)
    dp_size: int = 1
    dp_rank: int = 0
    dp_address: str | None = None
    dp_rpc_port: int | None = None
    tp_size: int = 1
    # capacity
    max_num_seqs: int = 256
    max_model_len: int = 8192
    # vLLM --runner pooling: an embedding model (/v1/embeddings, no generation routes)
    pooling: bool = False
    # vLLM's VLLM_ENABLE_RESPONSES_API_STORE=1: /v1/responses keeps store=true answers (retrieve,
    # cancel, previous_response_id); without it store is ignored and background refused, as in vLLM
    responses_store: bool = False
    default_max_tokens: int = 64
    num_kv_blocks: int = 8192
    block_size: int = 16
    enable_prefix_caching: bool = True
    # vLLM NIXL-like side channel
    side_channel_host: str = "127.0.0.1"
    side_channel_port: int = 5600
    kv_lease_s: float = 480.0
    kv_fetch_timeout_s: float = 5.0
    # vLLM's kv_transfer_config.kv_load_failure_policy: "fail" (default: the request errors, 500)
    # or "recompute" (the decode computes the prompt itself)
    kv_load_failure_policy: str = "fail"
    # SGLang bootstrap
    bootstrap_port: int = 8998
    transfer_backend: str = "mooncake"
    bootstrap_timeout_s: float = 30.0
    waiting_timeout_s: float = 30.0
    # simulation
    cost: CostModel = field(default_factory=CostModel)
    initial_fault: str = "none"
    crash_after_s: float | None = None
    ignore_sigterm: bool = False  # a wedged engine: SIGTERM does nothing, only SIGKILL stops it
    zmq_pub_port: int | None = None
    zmq_interval_s: float = 1.0
    version: str = "0.11.0"
    request_id_headers: bool = False  # vLLM --enable-request-id-headers
    # an idle client connection is closed after this long, as uvicorn does for both engines
    # (vLLM: VLLM_HTTP_TIMEOUT_KEEP_ALIVE, default 5 s; SGLang: uvicorn's default, 5 s)
    keepalive_s: float = 5.0
    # vLLM --max-logprobs (default 20): more top logprobs per token are refused with a 400
    max_logprobs: int = 20

    @property
    def primary_name(self) -> str:
        return self.served_model_names[0]

    @property
    def is_producer(self) -> bool:
        return self.role in (Role.PREFILL, Role.BOTH)

    @property
    def is_consumer(self) -> bool:
        return self.role in (Role.DECODE, Role.BOTH)
