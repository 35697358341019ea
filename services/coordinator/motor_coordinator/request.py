"""Parsing of a dispatched OpenAI body (pure): model, stream flag and the prompt prefix.

Completions and chat are split prefill→decode. The pass-through APIs (:data:`PASSTHROUGH`:
embeddings, responses, vLLM's tokenize/detokenize/version) are relayed whole to one instance
(``passthrough.py``); their bodies are held to what the route needs (vLLM's own request shapes)
and everything else is the engine's business. For them ``model`` may be left out, as vLLM allows:
the coordinator then uses the one model it serves (``passthrough.resolve_model``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from motor_common.errors import InvalidArgument
from motor_common.openai_bounds import (
    MAX_STARTING_AFTER,
    check_model,
    check_pd_fields,
    check_response_id,
    load_object,
)

COMPLETIONS = "completions"
CHAT = "chat"
EMBEDDINGS = "embeddings"
RESPONSES = "responses"
TOKENIZE = "tokenize"
DETOKENIZE = "detokenize"
VERSION = "version"
# a stored response (vLLM): GET /v1/responses/{id}, POST /v1/responses/{id}/cancel
RESPONSES_RETRIEVE = "responses_retrieve"
RESPONSES_CANCEL = "responses_cancel"
PATHS = {COMPLETIONS: "/v1/completions", CHAT: "/v1/chat/completions", EMBEDDINGS: "/v1/embeddings",
         RESPONSES: "/v1/responses", TOKENIZE: "/tokenize", DETOKENIZE: "/detokenize", VERSION: "/version",
         RESPONSES_RETRIEVE: "/v1/responses/{id}", RESPONSES_CANCEL: "/v1/responses/{id}/cancel"}
# Routed by the response they name (response_homes.py); no model.
STORED_RESPONSE = frozenset({RESPONSES_RETRIEVE, RESPONSES_CANCEL})
PASSTHROUGH = frozenset({EMBEDDINGS, RESPONSES, TOKENIZE, DETOKENIZE, VERSION, *STORED_RESPONSE})
APIS = frozenset(PATHS)
# detokenize: token ids vLLM accepts (DetokenizeRequest: 0 .. 2^63-1)
MAX_TOKEN_ID = 2**63 - 1


@dataclass(frozen=True)
class ParsedRequest:
    api: str  # COMPLETIONS | CHAT
    body: Mapping[str, Any]
    model: str
    stream: bool

    @property
    def path(self) -> str:
        """The engine's path (with the query of a retrieve)."""
        if self.api in STORED_RESPONSE:
            path = PATHS[self.api].replace("{id}", self.body["response_id"])
            query = []
            if self.body.get("stream"):
                query.append("stream=true")
            if self.body.get("starting_after") is not None:
                query.append(f"starting_after={self.body['starting_after']}")
            return path + ("?" + "&".join(query) if query else "")
        return PATHS[self.api]

    @property
    def method(self) -> str:
        return "GET" if self.api in (VERSION, RESPONSES_RETRIEVE) else "POST"

    @property
    def response_id(self) -> str | None:
        """The stored response this request must reach: the one it retrieves or cancels, or the
        ``previous_response_id`` a new response continues; None for any other request."""
        if self.api in STORED_RESPONSE:
            return str(self.body["response_id"])
        if self.api == RESPONSES:
            prev = self.body.get("previous_response_id")
            return prev if isinstance(prev, str) else None
        return None

    @property
    def engine_body(self) -> dict[str, Any]:
        """The JSON body sent to the engine (none for a stored-response route: the id is in the path)."""
        return {} if self.api in STORED_RESPONSE else dict(self.body)


def parse_body(api: str, raw: bytes) -> ParsedRequest:
    """A Dispatch body (gRPC callers): parsed and held to the bounds the HTTP front applies
    (``motor_common.openai_bounds``: JSON depth, ``model`` length, no PD hand-off fields)."""
    req = parsed_request(api, {} if api == VERSION and not raw else load_object(raw))
    check_model(req.model)
    check_pd_fields(req.body)
    return req


def parsed_request(api: str, body: Any) -> ParsedRequest:
    """The checks of :func:`parse_body` on an already decoded body (the co-located HTTP front
    parses once)."""
    if not isinstance(body, dict):
        raise InvalidArgument("request body must be a JSON object", reason="INVALID_BODY")
    if api not in APIS:
        raise InvalidArgument(f"api must be one of {', '.join(sorted(APIS))}", reason="INVALID_API")
    if api in STORED_RESPONSE:
        _check_stored(api, body)
        return ParsedRequest(api, body, "", bool(body.get("stream")))
    model = body.get("model")
    if api in PASSTHROUGH and model is None:
        model = ""  # resolved by the dispatcher: the fleet's one model
    elif model is None:
        raise InvalidArgument("'model' is required", reason="MISSING_MODEL", metadata={"param": "model"})
    if not isinstance(model, str) or (not model and "model" in body):
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
        _check_passthrough(api, body)
    return ParsedRequest(api, body, model, stream)


def _bad(message: str, param: str) -> InvalidArgument:
    return InvalidArgument(message, reason="INVALID_BODY", metadata={"param": param})


def _check_passthrough(api: str, body: Mapping[str, Any]) -> None:
    """What each pass-through route needs, as vLLM 0.32 defines its request (the rest is the engine's)."""
    if api == VERSION:
        if body:
            raise _bad("GET /version takes no body", "body")
    elif api == TOKENIZE:  # TokenizeCompletionRequest (prompt) | TokenizeChatRequest (messages)
        if isinstance(body.get("prompt"), str):
            return
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise _bad("/tokenize needs 'prompt' (a string) or 'messages' (a list of objects)", "prompt")
    elif api == DETOKENIZE:
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID for t in tokens):
            raise _bad(f"/detokenize needs 'tokens': a list of token ids in [0, {MAX_TOKEN_ID}]", "tokens")
    elif api == EMBEDDINGS:  # input (text, texts, token ids, chat messages) or messages
        inp = body.get("input")
        if not (isinstance(inp, str | list) and inp != []) and not isinstance(body.get("messages"), list):
            raise _bad("/v1/embeddings needs 'input': a string, or a non-empty list of strings, token ids "
                       "or token-id lists", "input")
    elif api == RESPONSES:
        inp = body.get("input")
        if not isinstance(inp, str | list):
            raise _bad("/v1/responses needs 'input': a string or a list of input items", "input")
        if body.get("previous_response_id") is not None:
            check_response_id(body["previous_response_id"], "previous_response_id")


def _check_stored(api: str, body: Mapping[str, Any]) -> None:
    """The pseudo-body of a stored-response route: ``response_id``, and for a retrieve the query's
    ``stream`` and ``starting_after``; nothing else."""
    allowed = {"response_id", "stream", "starting_after"} if api == RESPONSES_RETRIEVE else {"response_id"}
    extra = sorted(set(body) - allowed)
    if extra:
        raise _bad(f"unexpected field {extra[0]!r} (a {api} request takes {', '.join(sorted(allowed))})", extra[0])
    check_response_id(body.get("response_id"))
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean", "stream")
    after = body.get("starting_after")
    if after is not None and (not isinstance(after, int) or isinstance(after, bool)
                              or not 0 <= after <= MAX_STARTING_AFTER):
        raise _bad(f"'starting_after' must be an integer in [0, {MAX_STARTING_AFTER}]", "starting_after")


def prompt_prefix(req: ParsedRequest, chars: int) -> str:
    """The first *chars* characters of the prompt as the engine would see it (roughly rendered)."""
    if req.api in PASSTHROUGH:
        inp = req.body.get("input", req.body.get("prompt"))
        return inp[:chars] if isinstance(inp, str) else ""
    if req.api == CHAT:
        parts: list[str] = []
        size = 0
        for m in req.body.get("messages", ()):
            content = m.get("content")
            if isinstance(content, list):  # content parts
                content = "".join(t for p in content if isinstance(p, dict) and isinstance(t := p.get("text"), str))
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
