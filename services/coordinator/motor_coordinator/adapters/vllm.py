"""vLLM (NixlConnector-style) hand-off, as vLLM's own disaggregated proxy does it.

Prefill: the client body with ``stream: false``, ``max_tokens: 1`` (``max_completion_tokens`` set to
1 when present, ``stream_options``, ``min_tokens`` and ``min_completion_tokens`` removed) and
``kv_transfer_params`` asking for a remote decode. Decode: the client body with the
``kv_transfer_params`` the prefill returned (unchanged body when it returned none).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from motor_common.domain import Endpoint, EngineType

PREFILL_KV_TRANSFER_PARAMS: Mapping[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def vllm_prefill_body(body: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(body)
    out["kv_transfer_params"] = dict(PREFILL_KV_TRANSFER_PARAMS)
    out["stream"] = False
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    for key in ("stream_options", "min_tokens", "min_completion_tokens"):
        out.pop(key, None)
    return out


def vllm_decode_body(body: Mapping[str, Any], prefill_reply: Mapping[str, Any] | None) -> dict[str, Any]:
    out = dict(body)
    params = prefill_reply.get("kv_transfer_params") if prefill_reply else None
    if params:
        out["kv_transfer_params"] = params
    return out


class VllmAdapter:
    engine = EngineType.VLLM
    concurrent = False

    def prefill_body(self, body: Mapping[str, Any], prefill: Endpoint) -> dict[str, Any]:
        return vllm_prefill_body(body)

    def decode_body(
        self, body: Mapping[str, Any], prefill_body: Mapping[str, Any], prefill_reply: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        return vllm_decode_body(body, prefill_reply)
