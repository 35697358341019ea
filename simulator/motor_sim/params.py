"""Request-body validation for /v1/completions and /v1/chat/completions (pure, no I/O).

Errors::

    InvalidRequest(message, param)   -> the flavour renders it as its own 400 error body
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from motor_common import toy_tokenizer as tokenizer
from motor_sim.generator import SamplingKey

Kind = Literal["completion", "chat"]


class InvalidRequest(Exception):
    """``value`` is the offending value (vLLM appends ``(parameter=.., value=..)``);
    ``validation`` marks a schema/type error (vLLM: pydantic's ``Bad Request`` shape)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, *,
                 value: Any = None, validation: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.value = value
        self.validation = validation


@dataclass(frozen=True, slots=True)
class Bootstrap:
    host: str
    port: int
    room: int


@dataclass(frozen=True, slots=True)
class Job:
    """One validated generation request."""

    kind: Kind
    model: str | None
    prompt_ids: tuple[int, ...]
    n: int
    max_tokens: int | None  # None: the engine default
    stop: tuple[str, ...]
    include_stop_str: bool
    key: SamplingKey
    logprobs: int | None  # completions: top-k count; chat: top_logprobs when logprobs=True
    stream: bool
    include_usage: bool
    continuous_usage: bool
    kv_transfer_params: Mapping[str, Any] | None
    bootstrap_host: str | None
    bootstrap_port: int | None
    bootstrap_room: int | None
    request_id: str | None  # vLLM body "request_id" / SGLang "rid"
    # False when the prompt was longer than parse()'s token cap: prompt_ids holds only its start
    # (the request is refused for its length, so the rest is never needed).
    prompt_complete: bool = True


def _int(body: Mapping[str, Any], name: str, default: int | None, lo: int | None = None) -> int | None:
    v = body.get(name, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidRequest(f"{name} must be an integer", name, value=v, validation=True)
    if lo is not None and v < lo:
        # vLLM's SamplingParams: ``n`` carries no parameter, the others do
        if name == "n":
            raise InvalidRequest(f"{name} must be at least {lo}, got {v}.")
        raise InvalidRequest(f"{name} must be at least {lo}, got {v}.", name, value=v)
    return v


def _logprobs(body: Mapping[str, Any], name: str, default: int | None) -> int | None:
    """Top-logprobs count: >= 0, or -1 for the whole vocabulary (vLLM); the engine bounds it."""
    v = _int(body, name, default)
    if v is not None and v < -1:
        raise InvalidRequest(f"`{name}` must be a positive value or -1.", name, value=v)
    return v


def _float(body: Mapping[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise InvalidRequest(f"{name} must be a number", name, value=v, validation=True)
    if name == "temperature" and float(v) < 0:
        raise InvalidRequest(f"temperature must be non-negative, got {float(v)}.", name, value=float(v))
    if name == "top_p" and not 0 < float(v) <= 1:
        raise InvalidRequest(f"top_p must be in (0, 1], got {float(v)}.", name, value=float(v))
    if not lo <= float(v) <= hi:
        raise InvalidRequest(f"{name} must be in [{lo}, {hi}], got {v}.", name, value=v)
    return float(v)


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(s for s in stop if s)
    raise InvalidRequest("stop must be a string or a list of strings", "stop")


def _prompt_ids(body: Mapping[str, Any], cap: int | None) -> tuple[int, ...]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tuple(tokenizer.encode(prompt, cap))
    if isinstance(prompt, list) and cap is not None:
        prompt = prompt[:cap]
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return tuple(prompt)
    if isinstance(prompt, list):
        raise InvalidRequest("motor-sim serves one prompt per request", "prompt")
    raise InvalidRequest("prompt must be a string or a list of token ids", "prompt")


# Tokens always counted exactly, whatever max_model_len: error messages name the exact length of
# any prompt up to this size, like vLLM's; beyond it they say "at least".
EXACT_COUNT_TOKENS = 65536


def token_cap(max_model_len: int | None) -> int | None:
    """How many prompt tokens parse() reads at most: enough to tell a prompt longer than
    *max_model_len* (and to count moderately long ones exactly), bounded so that a huge prompt
    cannot hold the event loop (a 60 MB prompt took 31 s to tokenize in full)."""
    return None if max_model_len is None else max(max_model_len + 1, EXACT_COUNT_TOKENS)


def parse(body: Any, kind: Kind, max_model_len: int | None = None) -> Job:
    """The validated request; with *max_model_len*, prompts are tokenized only up to
    ``token_cap(max_model_len)`` tokens (``Job.prompt_complete`` False beyond)."""
    cap = token_cap(max_model_len)
    if not isinstance(body, Mapping):
        raise InvalidRequest("request body must be a JSON object")
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise InvalidRequest("messages: Field required" if messages is None
                                 else "messages must be a list", "messages", validation=True)
        if not messages:
            raise InvalidRequest("Cannot apply chat template to an empty conversation. "
                                 "Provide at least one message.")
        if not all(isinstance(m, Mapping) for m in messages):
            raise InvalidRequest("every message must be an object", "messages")
        cont = bool(body.get("continue_final_message", False))
        if cont and body.get("add_generation_prompt"):
            raise InvalidRequest("Cannot set both `continue_final_message` and "
                                 "`add_generation_prompt` to True.")
        try:
            text = tokenizer.render_chat(
                messages, bool(body.get("add_generation_prompt", True)), continue_final_message=cont
            )
        except ValueError as exc:
            raise InvalidRequest(str(exc), "messages") from exc
        prompt_ids = tuple(tokenizer.encode(text, cap))
        max_tokens = _int(body, "max_completion_tokens", None, 1)
        if max_tokens is None:
            max_tokens = _int(body, "max_tokens", None, 1)
        if body.get("logprobs"):
            logprobs: int | None = _logprobs(body, "top_logprobs", 0)
        else:
            logprobs = None
    else:
        prompt_ids = _prompt_ids(body, cap)
        max_tokens = _int(body, "max_tokens", None, 1)
        logprobs = _logprobs(body, "logprobs", None)
    if not prompt_ids:
        raise InvalidRequest("prompt must not be empty", "prompt" if kind == "completion" else "messages")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest("model must be a string", "model")
    so = body.get("stream_options") or {}
    if not isinstance(so, Mapping):
        raise InvalidRequest("stream_options must be an object", "stream_options")
    stream = bool(body.get("stream", False))
    if so and not stream:
        raise InvalidRequest("Stream options can only be defined when `stream=True`.", "stream_options")
    ktp = body.get("kv_transfer_params")
    if ktp is not None and not isinstance(ktp, Mapping):
        raise InvalidRequest("kv_transfer_params must be an object", "kv_transfer_params")
    room = body.get("bootstrap_room")
    if room is not None and (isinstance(room, bool) or not isinstance(room, int)):
        raise InvalidRequest("bootstrap_room must be an integer", "bootstrap_room")
    bport = body.get("bootstrap_port")
    if bport is not None and (isinstance(bport, bool) or not isinstance(bport, int)):
        raise InvalidRequest("bootstrap_port must be an integer", "bootstrap_port")
    bhost = body.get("bootstrap_host")
    if bhost is not None and not isinstance(bhost, str):
        raise InvalidRequest("bootstrap_host must be a string", "bootstrap_host")
    seed = _int(body, "seed", None)
    rid = body.get("request_id", body.get("rid"))
    return Job(
        kind=kind,
        model=model,
        prompt_ids=prompt_ids,
        n=_int(body, "n", 1, 1) or 1,
        max_tokens=max_tokens,
        stop=_stop(body),
        include_stop_str=bool(body.get("include_stop_str_in_output", False)),
        key=SamplingKey(
            seed=seed if seed is not None else 0,
            temperature=_float(body, "temperature", 1.0, 0.0, 100.0),
            top_p=_float(body, "top_p", 1.0, 0.0, 1.0),
            top_k=_int(body, "top_k", -1) or -1,
        ),
        logprobs=logprobs,
        stream=stream,
        include_usage=bool(so.get("include_usage", False)),
        continuous_usage=bool(so.get("continuous_usage_stats", False)),
        kv_transfer_params=ktp,
        bootstrap_host=bhost,
        bootstrap_port=bport,
        bootstrap_room=room,
        request_id=rid if isinstance(rid, str) else None,
        prompt_complete=cap is None or len(prompt_ids) < cap,
    )
