"""OpenAI-facing protocol logic, no I/O: request validation and error objects.

Errors reach clients as OpenAI error objects::

    {"error": {"message": "...", "type": "...", "param": null, "code": "..."}}

with the HTTP status chosen from the canonical (gRPC) status code of the failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from motor_common.errors import InvalidArgument, MotorError


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


def error_for_status(code_name: str, message: str, reason: str | None = None) -> HttpError:
    """The OpenAI error for a failure with canonical status *code_name* and optional *reason*."""
    status, kind = _BY_CODE.get(code_name, (500, "server_error"))
    if reason and reason != code_name:
        code: str | None = reason.lower()
    else:
        code = _DEFAULT_CODE.get(status, code_name.lower() if status != 500 else "internal_error")
    return HttpError(status, message, kind, code)


def invalid(message: str, param: str | None = None, code: str = "invalid_request") -> InvalidArgument:
    return InvalidArgument(message, reason=code.upper(), metadata={"param": param} if param else None)


def validate_body(raw: bytes, api: str) -> dict[str, Any]:
    """Light validation of an OpenAI request body; *api* is ``completions`` or ``chat``.

    Only what the gateway must know: a JSON object, ``model`` a non-empty string, ``stream`` a
    boolean if present, ``prompt`` (completions) or ``messages`` (chat) present. Everything else is
    the engine's business. Raises :class:`InvalidArgument`.
    """
    if not raw:
        raise invalid("request body is empty: send a JSON object", code="invalid_json")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid(f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise invalid("request body must be a JSON object", code="invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("'model' is required and must be a non-empty string", "model")
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
    return body


def error_from_motor(exc: MotorError) -> HttpError:
    """The OpenAI error for a :class:`MotorError` (raised locally or translated from gRPC)."""
    err = error_for_status(exc.code, exc.message, exc.reason)
    param = exc.metadata.get("param")
    if param:
        err = HttpError(err.status, err.message, err.type, err.code, param)
    return err
