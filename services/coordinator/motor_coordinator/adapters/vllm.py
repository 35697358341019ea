"""vLLM (NixlConnector-style) hand-off, as vLLM's own disaggregated proxy does it.

Prefill: the client body with ``stream: false``, ``max_tokens: 1`` (``max_completion_tokens`` set to
1 when present, ``stream_options``, ``min_tokens`` and ``min_completion_tokens`` removed) and
``kv_transfer_params`` asking for a remote decode. Decode: the client body with the
``kv_transfer_params`` the prefill returned (unchanged body when it returned none, or something
that is not a JSON object: the decode then computes the prompt itself, and the client never sees
an engine's malformed hand-off as an error about its own request).

A decode that could not load the KV (NIXL handshake or transfer failed; vLLM's default
``kv_load_failure_policy: fail``) answers 500 ``InternalServerError`` — or, streamed, a 200 whose
first event after chat's role chunk is that error object. :func:`kv_load_failed` recognises both
from the answer's first bytes, so the dispatcher can run the hand-off again before the client
saw a byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

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
    if params and isinstance(params, dict):
        out["kv_transfer_params"] = params
    return out


# Beyond this many bytes of a stream without a decisive event, the answer is taken as healthy.
_PEEK_LIMIT = 64 * 1024


def _is_engine_error(obj: Any) -> bool:
    err = obj.get("error") if isinstance(obj, dict) else None
    return isinstance(err, dict) and err.get("type") == "InternalServerError"


def _role_only(obj: Any) -> bool:
    """Chat's first stream chunk: ``delta: {role, content: ""}`` and nothing generated yet."""
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list) or not choices:
        return False
    for ch in choices:
        delta = ch.get("delta") if isinstance(ch, dict) else None
        if not isinstance(delta, dict) or ch.get("finish_reason") is not None:
            return False
        if set(delta) - {"role", "content"} or delta.get("content"):
            return False
    return True


def kv_load_failed(status: int, content_type: str, head: bytes) -> bool | None:
    """Did the decode fail to load the prefill's KV? *head*: the whole body of a JSON answer, the
    first bytes of a stream. None: a stream whose first decisive event has not arrived yet."""
    if not content_type.startswith("text/event-stream"):
        if status != 500:
            return False
        try:
            return _is_engine_error(orjson.loads(head))
        except orjson.JSONDecodeError:
            return False
    if status != 200:
        return False
    events = head.split(b"\n\n")
    for event in events[:-1]:  # complete events only
        data = event.strip()
        if not data.startswith(b"data:"):
            continue
        payload = data[5:].strip()
        if payload == b"[DONE]":
            return False
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return False
        if _is_engine_error(obj):
            return True
        if not _role_only(obj):
            return False
    return False if len(head) > _PEEK_LIMIT else None


class VllmAdapter:
    engine = EngineType.VLLM
    concurrent = False

    def prefill_body(self, body: Mapping[str, Any], prefill: Endpoint) -> dict[str, Any]:
        return vllm_prefill_body(body)

    def decode_body(
        self, body: Mapping[str, Any], prefill_body: Mapping[str, Any], prefill_reply: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        return vllm_decode_body(body, prefill_reply)

    def handoff_failed(self, status: int, content_type: str, head: bytes) -> bool | None:
        return kv_load_failed(status, content_type, head)
