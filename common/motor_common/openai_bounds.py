"""Bounds on an OpenAI request body, shared by the HTTP front (``motor_common.openai_front``) and the
coordinator's ``Dispatch`` (pure, no I/O). Every problem is an ``InvalidArgument`` (HTTP 400)
whose ``param`` names the field.

* **JSON depth**: objects/arrays nested deeper than ``max_depth`` are refused. orjson parses up to
  1024 levels but serialises only 254, so without this bound a deep body parsed fine and then
  failed (500) when the coordinator re-encoded it for the engine.
* **JSON containers**: a body with more than ``MAX_JSON_CONTAINERS`` objects and arrays is refused.
  4 MiB of ``[],`` (4 KiB gzipped) parsed into 1.4 M lists, ~80 MB and a second or more of the
  event loop. Both bounds are checked on the bytes (:func:`json_shape`: C-speed ``bytes``/``re``
  passes, strings skipped) before any object is built.
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
# Objects and arrays in one body. Real requests stay far below: a token-id prompt is one array, a
# chat message with content parts a handful.
MAX_JSON_CONTAINERS = 100_000
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


# What the shape of a JSON text depends on: brackets, and quotes (brackets inside strings do not count).
_NOT_SHAPE = bytes(b for b in range(256) if b not in b'[]{}"')
_STRING = re.compile(rb'"[^"]*"')  # a string, once escapes are gone and only shape bytes are left
_SQUARE = bytes.maketrans(b"{}", b"[]")


def json_shape(raw: bytes, max_depth: int, max_containers: int = MAX_JSON_CONTAINERS) -> str | None:
    """``"JSON_TOO_MANY_CONTAINERS"``, ``"JSON_TOO_DEEP"`` or None for the JSON text *raw*, from
    its bytes alone (no object is built). Brackets inside strings do not count. Each step is one
    C-speed pass over the bytes (``bytes.replace``/``translate``/``count``, one ``re.sub``): the
    nesting is measured by deleting innermost ``[]`` pairs, at most *max_depth* + 1 times, over
    the brackets only (at most 2 x *max_containers* bytes by then). Text that is not JSON (an
    unclosed string, unbalanced brackets) may pass: the parser refuses it."""
    if raw.count(b"[") + raw.count(b"{") <= min(max_depth, max_containers):
        return None  # fast path: too few brackets to break either bound
    # Backslashes occur only in strings: drop escaped backslashes, then escaped quotes; every quote
    # left opens or closes a string.
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in raw else raw
    shape = unescaped.translate(None, _NOT_SHAPE)
    # Two adjacent quotes close a string and open the next, or open and close an empty one: dropping
    # them leaves every bracket on its side of the quotes (most strings hold no bracket).
    brackets = _STRING.sub(b"", shape.replace(b'""', b""))
    if brackets.count(b"[") + brackets.count(b"{") > max_containers:
        return "JSON_TOO_MANY_CONTAINERS"
    # A container whose children are all gone is an innermost pair: pass k deletes the
    # containers k levels high, so what survives max_depth passes sits deeper than max_depth.
    rest = brackets.translate(_SQUARE)
    for _ in range(max_depth + 1):
        shorter = rest.replace(b"[]", b"")
        if len(shorter) == len(rest):
            return None  # empty, or unbalanced leftovers (not JSON: the parser says so)
        rest = shorter
    return "JSON_TOO_DEEP"


def too_deep(raw: bytes, max_depth: int) -> bool:
    """Whether the JSON text *raw* nests objects/arrays more than *max_depth* levels."""
    return json_shape(raw, max_depth, max_containers=len(raw)) == "JSON_TOO_DEEP"


def load_object(raw: bytes, max_depth: int = MAX_JSON_DEPTH,
                max_containers: int = MAX_JSON_CONTAINERS) -> dict[str, Any]:
    """*raw* as a JSON object within *max_depth* levels and *max_containers* objects and arrays
    (both checked before parsing: :func:`json_shape`); raises ``InvalidArgument``."""
    if not raw:
        raise _invalid("request body is empty: send a JSON object", None, "INVALID_JSON")
    shape = json_shape(raw, max_depth, max_containers)
    if shape == "JSON_TOO_DEEP":
        raise _depth_error(max_depth)
    if shape is not None:
        raise _invalid(f"request body has too many JSON objects and arrays: at most {max_containers} are "
                       "accepted", None, shape)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "recursion" in str(exc).lower() or "depth" in str(exc).lower():
            raise _depth_error(max_depth) from None
        raise _invalid(f"request body is not valid JSON: {exc}", None, "INVALID_JSON") from None
    if not isinstance(body, dict):
        raise _invalid("request body must be a JSON object", None, "INVALID_BODY")
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
