"""vLLM 0.32's other OpenAI-server routes, as the engine shapes them (pure, no I/O):
``/tokenize``, ``/detokenize``, ``/v1/embeddings`` (``--runner pooling`` only, like an embedding
model) and ``/v1/responses`` (built on the chat generation: the request becomes chat messages).

Bodies follow vLLM's pydantic models (``vllm/entrypoints/serve/tokenize/protocol.py``,
``pooling/embed/protocol.py``, ``openai/responses``): ``model`` optional, validation failures as
vLLM's 400 error object. Embeddings are a deterministic unit vector per input, from its token ids
(``dimensions`` long, default 32), as floats or base64 float32 (``encoding_format``). A streamed
response (``stream: true``) is vLLM's event sequence (:class:`ResponseEvents`): ``event: <type>`` +
``data: <json>`` per event, ``sequence_number`` from 0.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from motor_common import toy_tokenizer as tokenizer
from motor_sim.generator import word_for
from motor_sim.service import ApiError

DEFAULT_DIMENSIONS = 32
MAX_DIMENSIONS = 4096
MAX_INPUTS = 2048


def _field_error(message: str, param: str, value: Any = None) -> ApiError:
    return ApiError(400, message, param=param, value=value, validation=True)


def tokenize(body: Mapping[str, Any], max_model_len: int) -> dict[str, Any]:
    """TokenizeCompletionRequest (``prompt``) or TokenizeChatRequest (``messages``)."""
    if isinstance(body.get("prompt"), str):
        text = body["prompt"]
    elif isinstance(body.get("messages"), list):
        try:
            text = tokenizer.render_chat(body["messages"], bool(body.get("add_generation_prompt", True)),
                                         bool(body.get("continue_final_message", False)))
        except (ValueError, AttributeError) as exc:
            raise _field_error(str(exc), "messages") from None
    else:
        raise _field_error("prompt: Field required", "prompt")
    ids = tokenizer.encode(text)
    strs = [word_for(t) for t in ids] if body.get("return_token_strs") else None
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": strs}


def detokenize(body: Mapping[str, Any]) -> dict[str, Any]:
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= 2**63 - 1 for t in tokens):
        raise _field_error("tokens: Input should be a valid list of integers in [0, 2^63-1]", "tokens", tokens)
    return {"prompt": " ".join(word_for(t) for t in tokens)}


def _vector(ids: Sequence[int], dims: int) -> list[float]:
    seed = hashlib.blake2b(struct.pack(f"<{len(ids)}Q", *ids), digest_size=16).digest()
    raw = []
    for i in range(dims):
        h = hashlib.blake2b(seed + i.to_bytes(4, "little"), digest_size=4).digest()
        raw.append(int.from_bytes(h, "little") / 2**31 - 1.0)
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [struct.unpack("<f", struct.pack("<f", x / norm))[0] for x in raw]


def _inputs(body: Mapping[str, Any]) -> list[list[int]]:
    inp = body.get("input")
    if isinstance(inp, str):
        return [tokenizer.encode(inp)]
    if isinstance(inp, list) and inp:
        if all(isinstance(x, str) for x in inp):
            return [tokenizer.encode(x) for x in inp]
        if all(isinstance(x, int) and not isinstance(x, bool) for x in inp):
            return [list(inp)]
        if all(isinstance(x, list) and all(isinstance(t, int) for t in x) for x in inp):
            return [list(x) for x in inp]
    raise _field_error("input: Input should be a string, a list of strings, a list of token ids or a list "
                       "of token-id lists", "input", inp)


def embeddings(body: Mapping[str, Any], model: str, max_model_len: int) -> dict[str, Any]:
    batches = _inputs(body)
    if len(batches) > MAX_INPUTS:
        raise ApiError(400, f"at most {MAX_INPUTS} inputs per request", param="input")
    dims = body.get("dimensions")
    if dims is None:
        dims = DEFAULT_DIMENSIONS
    if isinstance(dims, bool) or not isinstance(dims, int) or not 1 <= dims <= MAX_DIMENSIONS:
        raise ApiError(400, f"dimensions must be an integer in [1, {MAX_DIMENSIONS}]", param="dimensions")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise _field_error("encoding_format: Input should be 'float' or 'base64'", "encoding_format", fmt)
    for ids in batches:
        if len(ids) > max_model_len:
            raise ApiError(400, f"This model's maximum context length is {max_model_len} tokens. However, you "
                           f"requested {len(ids)} tokens in the input for embedding generation. Please reduce "
                           "the length of the input.", param="input")
    data = []
    for i, ids in enumerate(batches):
        vec = _vector(ids, dims)
        emb: list[float] | str = vec if fmt == "float" else base64.b64encode(
            struct.pack(f"<{len(vec)}f", *vec)).decode()
        data.append({"index": i, "object": "embedding", "embedding": emb})
    n = sum(len(ids) for ids in batches)
    return {"id": f"embd-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "model": model,
            "data": data, "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0,
                                    "prompt_tokens_details": None}}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def responses_to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """A /v1/responses body as the chat request the simulator generates with."""
    if "stream" in body and not isinstance(body["stream"], bool) and body["stream"] is not None:
        raise _field_error("stream: Input should be a valid boolean", "stream", body["stream"])
    inp = body.get("input")
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    if isinstance(inp, str):
        messages.append({"role": "user", "content": inp})
    elif isinstance(inp, list):
        for item in inp:
            if not isinstance(item, Mapping) or not isinstance(item.get("role"), str):
                raise _field_error("input: every item must be a message with a role", "input")
            messages.append({"role": item["role"], "content": _text_of(item.get("content"))})
    else:
        raise _field_error("input: Field required", "input")
    chat: dict[str, Any] = {"messages": messages}
    if body.get("model") is not None:
        chat["model"] = body["model"]
    for src, dst in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p")):
        if body.get(src) is not None:
            chat[dst] = body[src]
    return chat


def response_object(body: Mapping[str, Any], model: str, text: str, finish_reason: str | None,
                    input_tokens: int, output_tokens: int, cached: int, *, response_id: str | None = None,
                    message_id: str | None = None, created_at: int | None = None) -> dict[str, Any]:
    """vLLM's ResponsesResponse for a finished generation."""
    incomplete = finish_reason == "length"
    return {
        "id": response_id or new_response_id(body), "created_at": created_at or int(time.time()),
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.get("instructions"), "metadata": body.get("metadata"), "model": model,
        "object": "response",
        "output": [{"id": message_id or f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
                    "status": "incomplete" if incomplete else "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": None}]}],
        "parallel_tool_calls": True, "temperature": body.get("temperature"), "tool_choice": "auto",
        "tools": [], "top_p": body.get("top_p"), "background": bool(body.get("background")),
        "max_output_tokens": body.get("max_output_tokens"), "max_tool_calls": None,
        "previous_response_id": body.get("previous_response_id"), "prompt": None, "reasoning": None, "service_tier": "auto",
        "status": "incomplete" if incomplete else "completed", "text": None, "top_logprobs": None,
        "truncation": "disabled",
        "usage": {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": cached},
                  "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": input_tokens + output_tokens},
        "user": None,
    }


MAX_STORED = 10_000  # vLLM's store is unbounded; the simulator forgets the oldest beyond this


def new_response_id(body: Mapping[str, Any]) -> str:
    """vLLM's response id: the body's ``request_id``, else ``resp_`` + 16 hex digits."""
    given = body.get("request_id")
    return given if isinstance(given, str) and given else f"resp_{uuid.uuid4().hex[:16]}"


def not_found(response_id: str) -> ApiError:
    """vLLM's answer for an id its store does not hold (``_make_not_found_error``)."""
    return ApiError(404, f"Response with id '{response_id}' not found.", "invalid_request_error", param="response_id")


class ResponseStore:
    """vLLM's response store (``OpenAIServingResponses.response_store``), bounded: retrieve,
    cancel and ``previous_response_id`` read it; only with ``VLLM_ENABLE_RESPONSES_API_STORE``."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._store: dict[str, dict[str, Any]] = {}
        self.found = self.not_found = 0  # lookups (retrieve, cancel, previous_response_id), for /sim/state

    def to_json(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "stored": len(self._store), "found": self.found, "not_found": self.not_found}

    def put(self, response: dict[str, Any]) -> None:
        if response["id"] not in self._store:
            while len(self._store) >= MAX_STORED:
                del self._store[next(iter(self._store))]
        self._store[response["id"]] = response

    def get(self, response_id: str) -> dict[str, Any]:
        found = self._store.get(response_id)
        if found is None:
            self.not_found += 1
            raise not_found(response_id)
        self.found += 1
        return found

    def finish(self, response: dict[str, Any]) -> None:
        """A finished answer replaces its stored self, unless it was cancelled meanwhile."""
        held = self._store.get(response["id"])
        if held is None or held["status"] != "cancelled":
            self.put(response)

    def cancel(self, response_id: str) -> dict[str, Any]:
        """vLLM's cancel: only a queued or in-progress (background) response."""
        response = self.get(response_id)
        if response["status"] not in ("queued", "in_progress"):
            raise ApiError(400, "Cannot cancel a synchronous response.", "invalid_request_error",
                           param="response_id")
        response["status"] = "cancelled"
        return response


def check_store_options(body: Mapping[str, Any], store: ResponseStore) -> None:
    """vLLM's checks of ``background`` / ``store`` / ``previous_response_id`` before generating."""
    if body.get("background"):
        if body.get("store", True) is False:
            raise _field_error("background can only be used when `store` is true", "background", True)
        if not store.enabled:
            raise ApiError(400, "This vLLM engine does not support `store=True` and therefore does not support the "
                           "background mode. To enable these features, set the environment variable "
                           "`VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.",
                           "invalid_request_error", param="background")
        if body.get("stream"):
            raise ApiError(400, "motor-sim does not simulate background streaming (background with stream)",
                           "invalid_request_error", param="stream")
    prev = body.get("previous_response_id")
    if prev is not None:
        store.get(str(prev))


class ResponseEvents:
    """The SSE events of one streamed /v1/responses answer, in vLLM 0.32's order: created,
    in_progress, output_item.added, content_part.added, output_text.delta per token,
    output_text.done, content_part.done, output_item.done, completed."""

    def __init__(self, body: Mapping[str, Any], model: str, response_id: str | None = None) -> None:
        self.body, self.model = body, model
        self.response_id = response_id or new_response_id(body)
        self.final: dict[str, Any] | None = None  # the completed response, once closed
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.seq = 0
        self.text = ""

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def opening(self) -> bytes:
        initial = response_object(self.body, self.model, "", None, 0, 0, 0, response_id=self.response_id,
                                  created_at=self.created_at)
        initial.update(status="in_progress", output=[], usage=None, incomplete_details=None)
        item = {"id": self.message_id, "type": "message", "role": "assistant", "content": [], "status": "in_progress"}
        return b"".join((
            self._event("response.created", response=initial),
            self._event("response.in_progress", response=initial),
            self._event("response.output_item.added", output_index=0, item=item),
            self._event("response.content_part.added", output_index=0, item_id=self.message_id, content_index=0,
                        part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}),
        ))

    def delta(self, text: str) -> bytes:
        if not text:
            return b""
        self.text += text
        return self._event("response.output_text.delta", content_index=0, output_index=0, item_id=self.message_id,
                           delta=text, logprobs=[])

    def closing(self, finish_reason: str | None, input_tokens: int, output_tokens: int, cached: int) -> bytes:
        part: dict[str, Any] = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": None}
        final = self.final = response_object(
            self.body, self.model, self.text, finish_reason, input_tokens, output_tokens, cached,
            response_id=self.response_id, message_id=self.message_id, created_at=self.created_at)
        return b"".join((
            self._event("response.output_text.done", output_index=0, content_index=0, text=self.text, logprobs=[],
                        item_id=self.message_id),
            self._event("response.content_part.done", item_id=self.message_id, output_index=0, content_index=0,
                        part=part),
            self._event("response.output_item.done", output_index=0,
                        item={"id": self.message_id, "type": "message", "role": "assistant",
                              "content": [part] if self.text else [], "status": "completed"}),
            self._event("response.completed", response=final),
        ))
