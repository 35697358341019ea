"""Parsing of a dispatched OpenAI body (pure): model, stream flag and the prompt prefix."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from motor_common.errors import InvalidArgument
from motor_common.openai_bounds import check_model, check_pd_fields, load_object

COMPLETIONS = "completions"
CHAT = "chat"
PATHS = {COMPLETIONS: "/v1/completions", CHAT: "/v1/chat/completions"}


@dataclass(frozen=True)
class ParsedRequest:
    api: str  # COMPLETIONS | CHAT
    body: Mapping[str, Any]
    model: str
    stream: bool

    @property
    def path(self) -> str:
        return PATHS[self.api]


def parse_body(api: str, raw: bytes) -> ParsedRequest:
    """A Dispatch body (gRPC callers): parsed and held to the bounds the HTTP front applies
    (``motor_common.openai_bounds``: JSON depth, ``model`` length, no PD hand-off fields)."""
    req = parsed_request(api, load_object(raw))
    check_model(req.model)
    check_pd_fields(req.body)
    return req


def parsed_request(api: str, body: Any) -> ParsedRequest:
    """The checks of :func:`parse_body` on an already decoded body (the co-located HTTP front
    parses once)."""
    if not isinstance(body, dict):
        raise InvalidArgument("request body must be a JSON object", reason="INVALID_BODY")
    model = body.get("model")
    if model is None:
        raise InvalidArgument("'model' is required", reason="MISSING_MODEL", metadata={"param": "model"})
    if not isinstance(model, str) or not model:
        raise InvalidArgument("'model' must be a non-empty string", reason="INVALID_BODY", metadata={"param": "model"})
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidArgument("'stream' must be a boolean", reason="INVALID_BODY", metadata={"param": "stream"})
    if api == CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise InvalidArgument(
                "'messages' must be a non-empty list of objects", reason="INVALID_BODY", metadata={"param": "messages"}
            )
    elif api == COMPLETIONS:
        prompt = body.get("prompt")
        if not isinstance(prompt, str | list):
            raise InvalidArgument(
                "'prompt' must be a string or a list", reason="INVALID_BODY", metadata={"param": "prompt"}
            )
    else:
        raise InvalidArgument("api must be OPEN_AI_API_COMPLETIONS or OPEN_AI_API_CHAT_COMPLETIONS", reason="INVALID_API")
    return ParsedRequest(api, body, model, stream)


def prompt_prefix(req: ParsedRequest, chars: int) -> str:
    """The first *chars* characters of the prompt as the engine would see it (roughly rendered)."""
    if req.api == CHAT:
        parts: list[str] = []
        size = 0
        for m in req.body.get("messages", ()):
            content = m.get("content")
            if isinstance(content, list):  # content parts
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            piece = f"<{m.get('role', '')}>{content if isinstance(content, str) else ''}"
            parts.append(piece)
            size += len(piece)
            if size >= chars:
                break
        return "".join(parts)[:chars]
    prompt = req.body.get("prompt")
    if isinstance(prompt, str):
        return prompt[:chars]
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            return first[:chars]
        return ",".join(str(t) for t in prompt)[:chars]  # token ids
    return ""
