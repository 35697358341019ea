"""Mid-stream migration (pure, no I/O): continue a stream whose engine died on another engine.

While a migratable SSE stream is relayed, :class:`StreamTracker` forwards only whole events and
remembers what the client got: the response id, ``created``, ``model``, the text of choice 0 and
how many tokens it took (one content event per token, as vLLM and SGLang stream). When the engine
dies after the first byte, :func:`continuation_body` builds the request that continues it — the
prompt plus the text already sent (completions), or the conversation plus the partial assistant
message with ``continue_final_message: true, add_generation_prompt: false`` (chat, vLLM's and
SGLang's API) — with ``max_tokens`` reduced by the tokens already sent. :meth:`StreamTracker.rewrite`
turns the continuation's events into events of the original stream: its id, ``created`` and
``model``, no second role event (chat), and usage as the uninterrupted request would count it
(prompt tokens minus, completion tokens plus, the tokens already sent).

Exact for greedy decoding (temperature 0) on any engine, and for everything on motor-sim: the
continuation's context is the uninterrupted run's context at that point. Seeded sampling on a real
engine restarts its random stream with the continuation: the text is a valid sample, not the same
one. Migratable: one choice (``n`` 1), no ``echo``/``logprobs``/``best_of``/``suffix``, no stop
strings or ``stop_token_ids`` (their hold-back splits tokens), no tools, a text prompt.

Events are framed as the SSE spec frames them: a line ends at CRLF, LF or CR, an event at an empty
line (LF LF, CRLF CRLF, CR CR or a mix). Only new bytes are scanned. An incomplete event
longer than :data:`MAX_PENDING_EVENT_BYTES` is not held back: the tracker stops tracking and relays
the rest of the stream as it comes (``tracking`` false; the stream can no longer be continued), so
the client still gets every byte the engine sent. What is pending when the engine's stream ends is
relayed too (``end=True``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from itertools import pairwise
from typing import Any

import orjson

from motor_coordinator.request import CHAT, COMPLETIONS

_DONE = b"[DONE]"
_SEP = b"\n\n"
_EOL = re.compile(rb"[\r\n]")
_LF = 0x0A
_CR = 0x0D
# The longest incomplete event held back from the client: a token's event is a few hundred bytes,
# a usage event not many more; past this a stream is relayed untracked (module docstring).
MAX_PENDING_EVENT_BYTES = 1 << 20
# Completions' default max_tokens in the OpenAI API and vLLM (chat defaults to the room left,
# which shrinks by exactly the tokens sent, so it needs no rewrite).
_COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def migratable(api: str, body: Mapping[str, Any]) -> bool:
    """Whether a stream of this request can be continued on another engine (module docstring)."""
    if body.get("n") not in (None, 1) or body.get("best_of") not in (None, 1):
        return False
    if body.get("echo") or body.get("logprobs") or body.get("top_logprobs") or body.get("suffix"):
        return False
    if body.get("stop") or body.get("stop_token_ids") or body.get("tools") or body.get("functions"):
        return False
    if api == COMPLETIONS:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        return isinstance(prompt, str)
    return api == CHAT and not body.get("continue_final_message")


def _max_tokens_key(api: str, body: Mapping[str, Any]) -> str | None:
    for key in ("max_completion_tokens", "max_tokens") if api == CHAT else ("max_tokens",):
        if body.get(key) is not None:
            return key
    return None


class StreamTracker:
    """What the client has received of one migratable SSE stream (see the module docstring)."""

    __slots__ = ("_buf", "_cr", "_line", "_sent_before", "api", "created", "done", "finished", "id", "model",
                 "text", "tokens", "tracking")

    def __init__(self, api: str) -> None:
        self.api = api
        self._buf = bytearray()  # the incomplete event not sent yet
        self._line = 0  # where the current line starts in _buf
        self._cr = -2  # where in _buf the last CR that ended a line is (-1: just before _buf; -2: none)
        self.id: str | None = None
        self.created: int | None = None
        self.model: str | None = None
        self.text = ""
        self.tokens = 0
        self.finished = False  # a finish_reason was sent
        self.done = False  # [DONE] was sent
        self.tracking = True  # false: an event was too long; the stream is relayed as it comes
        self._sent_before = 0  # tokens sent before the current continuation

    @property
    def pending(self) -> int:
        """How many bytes are held back (an incomplete event)."""
        return len(self._buf)

    def _whole_events(self, data: bytes, end: bool) -> list[bytes]:
        """The SSE events that *data* completes, each as received (with its blank line); an
        incomplete tail stays buffered, unless *end* (the stream ended: it is the last event).
        Only *data* is scanned for line ends."""
        buf = self._buf
        scanned = len(buf)
        buf += data
        line, cr = self._line, self._cr
        cuts: list[int] = []
        for m in _EOL.finditer(buf, scanned):
            i = m.start()
            if buf[i] == _LF and cr == i - 1:  # the LF of a CRLF: the line ended at its CR
                line = i + 1
                if cuts and cuts[-1] == i:
                    cuts[-1] = i + 1
                elif i == 0:  # its CR ended the last event sent: this LF follows it at once
                    cuts.append(1)
                continue
            if i == line:  # an empty line ends the event
                cuts.append(i + 1)
            line = i + 1
            cr = i if buf[i] == _CR else -2
        if end and len(buf) > (cuts[-1] if cuts else 0):
            cuts.append(len(buf))
        cut = cuts[-1] if cuts else 0
        self._line, self._cr = line - cut, max(cr - cut, -2)
        if not cuts:
            return []
        whole = bytes(buf[:cut])
        del buf[:cut]
        return [whole[a:b] for a, b in pairwise([0, *cuts])]

    def _stop_tracking(self) -> bytes:
        """The pending bytes, to relay as they are; from now on nothing is held back."""
        self.tracking = False
        pending = bytes(self._buf)
        self._buf.clear()
        return pending

    def feed(self, data: bytes, *, end: bool = False) -> bytes:
        """The whole events in *data* (plus what was buffered), unchanged, to send to the client;
        *end*: the engine's stream ended (what is pending is sent too)."""
        if not self.tracking:
            return data
        events = self._whole_events(data, end)
        for event in events:
            payload = _payload(event)
            if payload is None:
                continue
            if payload == _DONE:
                self.done = True
                continue
            obj = _json(payload)
            if obj is not None:
                self._note(obj)
        out = b"".join(events)
        if len(self._buf) > MAX_PENDING_EVENT_BYTES:
            out += self._stop_tracking()
        return out

    def _note(self, obj: dict[str, Any]) -> None:
        if self.id is None:
            self.id, self.created, self.model = obj.get("id"), obj.get("created"), obj.get("model")
        for ch in obj.get("choices") or ():
            if not isinstance(ch, dict) or ch.get("index", 0) != 0:
                continue
            piece = _piece(self.api, ch)
            if piece:
                self.text += piece
                self.tokens += 1
            if ch.get("finish_reason") is not None:
                self.finished = True

    def rewrite(self, data: bytes, *, end: bool = False) -> bytes:
        """The continuation's whole events in *data* as events of the original stream; *end*: the
        continuation's stream ended (what is pending is rewritten as its last event)."""
        if not self.tracking:
            return data
        out: list[bytes] = []
        for event in self._whole_events(data, end):
            payload = _payload(event)
            if payload is None:
                continue
            if payload == _DONE:
                self.done = True
                out.append(b"data: [DONE]\n\n")
                continue
            obj = _json(payload)
            if obj is None:
                continue
            if self._is_role_only(obj):
                continue  # the client already has the assistant role
            self._adopt(obj)
            self._note_continuation(obj)
            out.append(b"data: " + orjson.dumps(obj) + _SEP)
        if len(self._buf) > MAX_PENDING_EVENT_BYTES:
            out.append(self._stop_tracking())
        return b"".join(out)

    def _is_role_only(self, obj: dict[str, Any]) -> bool:
        if self.api != CHAT:
            return False
        choices = obj.get("choices") or ()
        return bool(choices) and all(
            isinstance(ch, dict) and isinstance(ch.get("delta"), dict) and "role" in ch["delta"]
            and not ch["delta"].get("content") and ch.get("finish_reason") is None
            for ch in choices
        )

    def _adopt(self, obj: dict[str, Any]) -> None:
        if self.id is not None:
            obj["id"] = self.id
        if self.created is not None:
            obj["created"] = self.created
        if self.model is not None:
            obj["model"] = self.model
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            # counted as the uninterrupted request: the sent tokens are completion, not prompt
            usage["prompt_tokens"] -= self._sent_before
            if isinstance(usage.get("completion_tokens"), int):
                usage["completion_tokens"] += self._sent_before

    def _note_continuation(self, obj: dict[str, Any]) -> None:
        for ch in obj.get("choices") or ():
            if isinstance(ch, dict) and ch.get("index", 0) == 0:
                piece = _piece(self.api, ch)
                if piece:
                    self.text += piece
                    self.tokens += 1
                if ch.get("finish_reason") is not None:
                    self.finished = True

    def continuation(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """The body that continues the stream after the text sent so far (None: nothing is left
        to generate), and from now on :meth:`rewrite` counts usage against it."""
        self._buf.clear()
        self._line, self._cr = 0, -2
        out = dict(body)
        if self.finished:
            return None
        self._sent_before = self.tokens
        if not self.tokens:  # only the head (and the chat role) was sent: the request as it was
            return out
        key = _max_tokens_key(self.api, body)
        limit: int | None = int(body[key]) if key is not None else None
        if key is None and self.api == COMPLETIONS:
            key, limit = "max_tokens", _COMPLETIONS_DEFAULT_MAX_TOKENS
        # chat without a limit is bounded by the room left, which shrank by the text sent
        if key is not None and limit is not None:
            if limit - self.tokens <= 0:
                return None
            out[key] = limit - self.tokens
        if self.api == COMPLETIONS:
            prompt = body["prompt"]
            if isinstance(prompt, list):
                prompt = prompt[0]
            out["prompt"] = prompt + self.text
        else:
            out["messages"] = [*body["messages"], {"role": "assistant", "content": self.text}]
            out["continue_final_message"] = True
            out["add_generation_prompt"] = False
        if isinstance(out.get("min_tokens"), int):
            out["min_tokens"] = max(0, out["min_tokens"] - self.tokens)
        return out

    def tail(self) -> bytes:
        """How to end a stream that broke when nothing was left to generate."""
        return b"" if self.done else b"data: [DONE]\n\n"


def _payload(event: bytes) -> bytes | None:
    """The event's data (its ``data:`` lines joined), None when it has none."""
    data = [line[5:] for line in event.splitlines() if line.startswith(b"data:")]
    return b"\n".join(data).strip() if data else None


def _json(payload: bytes) -> dict[str, Any] | None:
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _piece(api: str, choice: Mapping[str, Any]) -> str:
    if api == CHAT:
        delta = choice.get("delta")
        content = delta.get("content") if isinstance(delta, dict) else None
    else:
        content = choice.get("text")
    return content if isinstance(content, str) else ""
