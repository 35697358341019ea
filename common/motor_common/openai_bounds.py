"""Bounds on an OpenAI request body, shared by the HTTP front (``motor_common.openai_front``) and the
coordinator's ``Dispatch`` (pure, no I/O). Every problem is an ``InvalidArgument`` (HTTP 400)
whose ``param`` names the field.

* **JSON depth**: objects/arrays nested deeper than ``max_depth`` are refused. orjson parses up to
  1024 levels but serialises only 254, so without this bound a deep body parsed fine and then
  failed (500) when the coordinator re-encoded it for the engine.
* **model** at most ``max_model_chars`` characters: the name travels in error messages and gRPC
  metadata, where a long one overflowed the 8 KiB metadata limit (a false 429).
* **PD hand-off fields** (``PD_FIELDS``) are set by the coordinator only. A client-supplied
  ``kv_transfer_params`` reached the decode engine when the prefill returned none, and malformed
  ones kill a real vLLM decode (an assertion in its NIXL scheduler), so they are refused, not
  silently dropped: a client that sends them expects a behaviour Motor will not give it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from motor_common.errors import InvalidArgument

MAX_JSON_DEPTH = 64
MAX_MODEL_CHARS = 256
# Fields of the engines' PD hand-off protocols (vLLM NIXL / encoder-cache transfer, SGLang bootstrap).
PD_FIELDS = (
    "kv_transfer_params",
    "ec_transfer_params",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "bootstrap_pair_key",
)

# A stored response's id (GET /v1/responses/{id}, previous_response_id): vLLM's are "resp_" + 16
# hex digits; a client may choose its own (``request_id`` in the body), held to a path-safe charset.
MAX_RESPONSE_ID_CHARS = 256
# GET /v1/responses/{id}?stream=true&starting_after=N: the event index a resumed stream starts after
MAX_STARTING_AFTER = 2**31 - 1
_RESPONSE_ID = re.compile(r"[A-Za-z0-9_.:-]+")


def _invalid(message: str, param: str | None, reason: str) -> InvalidArgument:
    return InvalidArgument(message, reason=reason, metadata={"param": param} if param else None)


def too_deep(raw: bytes, body: Any, max_depth: int) -> bool:
    """Whether *body* (parsed from *raw*) nests objects/arrays more than *max_depth* levels.

    Fast path: a body with at most *max_depth* brackets cannot be deeper (two ``bytes.count``)."""
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return False
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False


def load_object(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> dict[str, Any]:
    """*raw* as a JSON object within *max_depth* levels; raises ``InvalidArgument``."""
    if not raw:
        raise _invalid("request body is empty: send a JSON object", None, "INVALID_JSON")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "recursion" in str(exc).lower() or "depth" in str(exc).lower():
            raise _depth_error(max_depth) from None
        raise _invalid(f"request body is not valid JSON: {exc}", None, "INVALID_JSON") from None
    if not isinstance(body, dict):
        raise _invalid("request body must be a JSON object", None, "INVALID_BODY")
    if too_deep(raw, body, max_depth):
        raise _depth_error(max_depth)
    return body


def _depth_error(max_depth: int) -> InvalidArgument:
    return _invalid(f"request body is nested too deeply: at most {max_depth} levels of objects and "
                    "arrays are accepted", None, "JSON_TOO_DEEP")


def check_model(model: str, max_chars: int = MAX_MODEL_CHARS) -> None:
    if len(model) > max_chars:
        raise _invalid(f"'model' is too long ({len(model)} characters, at most {max_chars})",
                       "model", "MODEL_TOO_LONG")


def check_pd_fields(body: Mapping[str, Any]) -> None:
    """Refuse PD hand-off fields: only the coordinator sets them."""
    for name in PD_FIELDS:
        if name in body:
            raise _invalid(f"'{name}' is set by Motor for the prefill/decode hand-off and cannot be "
                           "sent by clients: remove it from the request", name, "RESERVED_FIELD")


def check_response_id(value: Any, param: str = "response_id") -> str:
    """*value* as a response id, or ``InvalidArgument`` naming *param*."""
    if not isinstance(value, str) or not value:
        raise _invalid(f"'{param}' must be a non-empty string", param, "INVALID_BODY")
    if len(value) > MAX_RESPONSE_ID_CHARS or not _RESPONSE_ID.fullmatch(value):
        shown = value[:64] + ("…" if len(value) > 64 else "")
        raise _invalid(f"{param} {shown!r} is not a response id: at most {MAX_RESPONSE_ID_CHARS} letters, digits, "
                       "'_', '-', '.' or ':' (vLLM's look like resp_0123456789abcdef)", param, "INVALID_RESPONSE_ID")
    return value
