"""OpenAI-facing protocol logic, no I/O: request validation and error objects.

Errors reach clients as OpenAI error objects::

    {"error": {"message": "...", "type": "...", "param": null, "code": "..."}}

with the HTTP status chosen from the canonical (gRPC) status code of the failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from motor_common.errors import InvalidArgument, MotorError
from motor_common.openai_bounds import (
    MAX_STARTING_AFTER,
    check_model,
    check_pd_fields,
    check_response_id,
    load_object,
)
from motor_common.openai_front.limits import HttpLimits

_DEFAULT_LIMITS = HttpLimits()


@dataclass(frozen=True)
class HttpError:
    """An OpenAI error object and its HTTP status."""

    status: int
    message: str
    type: str
    code: str | None = None
    param: str | None = None

    def body(self) -> dict[str, Any]:
        return {
            "error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        }

    def json(self) -> bytes:
        return orjson.dumps(self.body())

    def sse_event(self) -> bytes:
        """The error as a final SSE event (used once a stream has started)."""
        return b"data: " + self.json() + b"\n\n"


# canonical status code name → (HTTP status, OpenAI error type)
_BY_CODE: dict[str, tuple[int, str]] = {
    "INVALID_ARGUMENT": (400, "invalid_request_error"),
    "FAILED_PRECONDITION": (400, "invalid_request_error"),
    "OUT_OF_RANGE": (400, "invalid_request_error"),
    "UNAUTHENTICATED": (401, "authentication_error"),
    "PERMISSION_DENIED": (403, "permission_error"),
    "NOT_FOUND": (404, "not_found_error"),
    "ALREADY_EXISTS": (409, "conflict_error"),
    "ABORTED": (409, "conflict_error"),
    "RESOURCE_EXHAUSTED": (429, "rate_limit_error"),
    "CANCELLED": (499, "cancelled"),
    "UNAVAILABLE": (503, "service_unavailable_error"),
    "DEADLINE_EXCEEDED": (504, "timeout_error"),
}
_DEFAULT_CODE = {404: "model_not_found", 504: "timeout", 503: "service_unavailable"}
# Transient refusals an SDK should simply retry: the OpenAI code stays the generic
# ``service_unavailable`` (the message says why), and the response carries ``Retry-After``.
_TRANSIENT_REASONS = frozenset({"REGISTRY_NOT_SYNCED"})
# Seconds a client should wait before retrying a 503 (``Retry-After``).
RETRY_AFTER_SEC = 1


def error_for_status(code_name: str, message: str, reason: str | None = None) -> HttpError:
    """The OpenAI error for a failure with canonical status *code_name* and optional *reason*."""
    status, kind = _BY_CODE.get(code_name, (500, "server_error"))
    if reason and reason != code_name and reason not in _TRANSIENT_REASONS:
        code: str | None = reason.lower()
    else:
        code = _DEFAULT_CODE.get(status, code_name.lower() if status != 500 else "internal_error")
    return HttpError(status, message, kind, code)


def invalid(message: str, param: str | None = None, code: str = "invalid_request") -> InvalidArgument:
    return InvalidArgument(message, reason=code.upper(), metadata={"param": param} if param else None)


# Routes relayed whole to one instance (the coordinator's passthrough.py): path → api.
PASSTHROUGH_ROUTES = {"/v1/embeddings": "embeddings", "/v1/responses": "responses", "/tokenize": "tokenize",
                      "/detokenize": "detokenize"}


def validate_body(raw: bytes, api: str, limits: HttpLimits = _DEFAULT_LIMITS) -> dict[str, Any]:
    """Validation of an OpenAI request body; *api* is ``completions``, ``chat`` or a pass-through
    API (``PASSTHROUGH_ROUTES``; ``model`` optional there, as vLLM allows, and the route's own
    fields checked by the coordinator).

    What the front must know or bound: a JSON object within ``limits.max_json_depth`` levels,
    ``model`` a non-empty string of at most ``limits.max_model_chars``, ``stream`` a boolean if
    present, ``prompt`` (completions) or ``messages`` (chat) present, no PD hand-off field
    (``motor_common.openai_bounds.PD_FIELDS``). Everything else is the engine's business.
    Raises :class:`InvalidArgument`.
    """
    body = load_object(raw, limits.max_json_depth)
    model = body.get("model")
    if api in PASSTHROUGH_ROUTES.values():
        if model is not None and (not isinstance(model, str) or not model):
            raise invalid("'model' must be a non-empty string", "model")
        if model is not None:
            check_model(model, limits.max_model_chars)
        if "stream" in body and not isinstance(body["stream"], bool) and body["stream"] is not None:
            raise invalid("'stream' must be a boolean", "stream")
        check_pd_fields(body)
        return body
    if not isinstance(model, str) or not model:
        raise invalid("'model' is required and must be a non-empty string", "model")
    check_model(model, limits.max_model_chars)
    if "stream" in body and not isinstance(body["stream"], bool) and body["stream"] is not None:
        raise invalid("'stream' must be a boolean", "stream")
    if api == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise invalid("'messages' is required and must be a list", "messages")
    else:
        prompt = body.get("prompt")
        if prompt is None:
            raise invalid("'prompt' is required", "prompt")
        if not isinstance(prompt, str | list):
            raise invalid("'prompt' must be a string or a list", "prompt")
    check_pd_fields(body)
    return body


_BOOLS = {"true": True, "1": True, "false": False, "0": False}


def stored_response_body(api: str, response_id: str, query: Mapping[str, str]) -> dict[str, Any]:
    """The dispatch body of a stored-response route (``responses_retrieve``: GET
    /v1/responses/{id}?stream=&starting_after=, ``responses_cancel``: POST .../cancel): the id
    checked (``openai_bounds.check_response_id``), the retrieve's query as typed fields. Query
    parameters vLLM does not read are ignored, as vLLM does. Raises :class:`InvalidArgument`."""
    body: dict[str, Any] = {"response_id": check_response_id(response_id)}
    if api != "responses_retrieve":
        return body
    stream = query.get("stream")
    if stream is not None:
        if stream.lower() not in _BOOLS:
            raise invalid("query parameter 'stream' must be true or false", "stream")
        body["stream"] = _BOOLS[stream.lower()]
    after = query.get("starting_after")
    if after is not None:
        if not after.isdigit() or int(after) > MAX_STARTING_AFTER:
            raise invalid(f"query parameter 'starting_after' must be an integer in [0, {MAX_STARTING_AFTER}]",
                          "starting_after")
        body["starting_after"] = int(after)
    return body


def error_from_motor(exc: MotorError) -> HttpError:
    """The OpenAI error for a :class:`MotorError` (raised locally or translated from gRPC)."""
    err = error_for_status(exc.code, exc.message, exc.reason)
    param = exc.metadata.get("param")
    if param:
        err = HttpError(err.status, err.message, err.type, err.code, param)
    return err


# Server-side failures (5xx) whose message is written for clients: no engine or coordinator
# addresses, no exception names. Every other 5xx message is replaced by a public one below and
# the original goes to the log with the request id.
_SAFE_5XX = frozenset({"no_schedulable_instance", "request_timeout", "not_master", "isolated",
                       "stream_not_continued", "response_too_large"})
_PUBLIC_BY_CODE = {
    "prefill_failed": "the model's prefill engines failed to process the request; retry later",
    "decode_failed": "the model's decode engines failed to process the request; retry later",
    "union_failed": "the model's engines failed to process the request; retry later",
    "engine_stream_broken": "the engine broke off the response; retry the request",
    "coordinator_unreachable": "the coordinator is unreachable; retry later",
    "no_master_coordinator": "no coordinator can take requests right now (failover in progress); retry later",
    "engine_error": "the engine failed to process the request; retry later",
    "kv_transfer_failed": "the model's decode engine could not take over the request from its prefill engine; "
                          "retry later",
}
_PUBLIC_BY_STATUS = {
    502: "the coordinator could not answer this request",
    503: "the service cannot serve this request right now; retry later",
    504: "the request did not finish in time",
}


def public(err: HttpError, request_id: str) -> HttpError:
    """*err* as a client may see it: 4xx and known-safe 5xx unchanged, any other 5xx with a
    message that names the request id and nothing internal."""
    if err.status < 500 or err.code in _SAFE_5XX:
        return err
    text = _PUBLIC_BY_CODE.get(err.code or "") or _PUBLIC_BY_STATUS.get(err.status, "internal error")
    return HttpError(err.status, f"{text} (request id {request_id})", err.type, err.code, err.param)


def public_engine_error(status: int, request_id: str) -> bytes:
    """What a client gets instead of an engine's 5xx answer: one OpenAI error object naming the
    request id (the engine's own body goes to the log)."""
    return HttpError(status, _PUBLIC_BY_CODE["engine_error"] + f" (request id {request_id})",
                     "server_error", "engine_error").json()


def engine_error_body(status: int, body: bytes, request_id: str) -> bytes | None:
    """The body to send instead of an engine's error answer (*status* >= 400), or None to relay it
    unchanged. A 4xx already in OpenAI's shape (vLLM) is relayed as it is; another 4xx shape
    (SGLang's flat ``{"object": "error", ...}``, FastAPI's ``{"detail": ...}``, text) is put in
    that shape with the engine's message; a 5xx gets a public message (the caller logs the body)."""
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    if status >= 500:
        return public_engine_error(status, request_id)
    err = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(err, dict) and {"message", "type", "param", "code"} <= set(err) and isinstance(err["message"], str):
        return None
    src: dict[str, Any] = err if isinstance(err, dict) else parsed if isinstance(parsed, dict) else {}
    message = src.get("message") or src.get("detail") or body[:500].decode("utf-8", "replace").strip()
    if not isinstance(message, str):
        message = orjson.dumps(message).decode()[:500]
    param = src.get("param")
    code = src.get("code", status)
    return orjson.dumps({"error": {
        "message": message or f"the engine refused the request (HTTP {status})",
        "type": src.get("type") if isinstance(src.get("type"), str) else "invalid_request_error",
        "param": param if isinstance(param, str) else None,
        "code": code if isinstance(code, str | int) and not isinstance(code, bool) else status,
    }})
