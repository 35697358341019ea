"""Deterministic text generation (pure, no I/O).

Generation is autoregressive, like a real engine's: the next token is a pure function of (model,
sampling key, salt, choice, *every token id before it*, prompt and generated alike) — a BLAKE2b
digest of a rolling hash of the context picks a word from a fixed vocabulary. So the same prompt,
seed and sampling parameters give identical text whether a request is served whole or split
across a prefill and a decode process, and a request re-sent with its already generated text
appended to the prompt (chat: as a partial assistant message, ``continue_final_message``)
continues with exactly the tokens the uninterrupted run would have produced — what a greedy
(temperature 0) real engine does too, and what mid-stream migration relies on. A real engine's
*seeded sampling* draws from a random stream that restarts with the continuation, so there the
continuation is a valid sample but not the same one; the simulator's "sampling" has no stream.

Like a real engine, which samples in float32, the floating-point sampling parameters are rounded
to float32 before they are hashed: a router that re-sends ``temperature: 0.8`` as
``0.800000011920929`` (its float32 value printed as a double) gets the same text. Log-probabilities
are float32 values too (a real engine's logits are float32).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from motor_common.toy_tokenizer import token_id

VOCAB: tuple[str, ...] = tuple(
    """the a of to and in is it that was for on are with as his they be at one have this from
    or had by hot word but what some we can out other were all there when up use your how said
    an each she which do their time if will way about many then them write would like so these
    her long make thing see him two has look more day could go come did number sound no most
    people my over know water than call first who may down side been now find any new work part
    take get place made live where after back little only round man year came show every good
    me give our under name very through just form sentence great think say help low line differ
    turn cause much mean before move right boy old too same tell does set three want air well
    also play small end put home read hand port large spell add even land here must big high
    such follow act why ask men change went light kind off need house picture try us again
    animal point mother world near build self earth father head stand own page should country
    found answer school grow study still learn plant cover food sun four between state keep eye
    never last let thought city tree cross farm hard start might story saw far sea draw left
    late run while press close night real life few north open seem together next white children
    begin got walk example ease paper group always music those both mark often letter until
    mile river car feet care second book carry took science eat room friend began idea fish
    mountain stop once base hear horse cut sure watch color face wood main enough plain girl
    usual young ready above ever red list though feel talk bird soon body dog family direct
    pose leave song measure door product black short numeral class wind question happen
    complete ship area half rock order fire south problem piece told knew pass since top whole
    king space heard best hour better true during hundred five remember step early hold west
    ground interest reach fast verb sing listen six table travel less morning ten simple""".split()
)
_ID_TO_WORD: dict[int, str] = {token_id(w): w for w in VOCAB}
_WORD_IDS: tuple[int, ...] = tuple(token_id(w) for w in VOCAB)
_F32 = struct.Struct("<f")


def f32(x: float) -> float:
    """*x* rounded to the nearest float32 (as a Python float)."""
    return float(_F32.unpack(_F32.pack(x))[0])


@dataclass(frozen=True, slots=True)
class SamplingKey:
    """The sampling parameters that influence which tokens are chosen (not how many)."""

    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1


def word_for(tid: int) -> str:
    """Text of a generated token id (unknown ids render as ``<tid>``)."""
    return _ID_TO_WORD.get(tid, f"<{tid}>")


def token_text(tid: int) -> str:
    """How a generated token appears in the output text (space-separated words)."""
    return " " + word_for(tid)


_MASK = (1 << 64) - 1
_FNV = 0x100000001B3
_CTX = struct.Struct("<QI")


@dataclass(frozen=True, slots=True)
class Context:
    """What the next token depends on: the request's fixed part and a rolling hash of all ids."""

    base: bytes
    state: int

    def advance(self, tid: int) -> Context:
        return Context(self.base, ((self.state ^ tid) * _FNV) & _MASK)


def sequence_digest(
    model: str, prompt_ids: Sequence[int], key: SamplingKey, salt: str = ""
) -> Context:
    """The context after the prompt (a rolling FNV-1a hash over its ids)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(model.encode())
    h.update(b"\0")
    h.update(repr((key.seed, f32(key.temperature), f32(key.top_p), key.top_k, salt)).encode())
    state = 0xCBF29CE484222325
    for tid in prompt_ids:
        state = ((state ^ tid) * _FNV) & _MASK
    return Context(h.digest(), state)


def _h(ctx: Context, choice: int) -> int:
    d = hashlib.blake2b(ctx.base + _CTX.pack(ctx.state, choice), digest_size=8).digest()
    return int.from_bytes(d, "little")


def token_at(ctx: Context, choice: int) -> int:
    """The next token of choice ``choice`` after context ``ctx``."""
    return _WORD_IDS[_h(ctx, choice) % len(_WORD_IDS)]


def logprob_of(ctx: Context, choice: int) -> float:
    """A deterministic fake log-probability in (-4.0, -0.01], a float32 value."""
    return f32(-0.01 - ((_h(ctx, choice) >> 20) % 3990) / 1000.0)


def top_alternatives(ctx: Context, choice: int, k: int) -> list[tuple[int, float]]:
    """``k`` (token id, logprob) pairs, the chosen token first, strictly decreasing logprobs.
    ``k`` is capped at the vocabulary size (-1: the whole vocabulary): a request can never ask
    for more distinct alternatives than exist (that loop used to spin for ever)."""
    k = len(_WORD_IDS) if k < 0 else min(k, len(_WORD_IDS))
    h = _h(ctx, choice)
    chosen = _WORD_IDS[h % len(_WORD_IDS)]
    lp = logprob_of(ctx, choice)
    out = [(chosen, lp)]
    i = 1
    while len(out) < k:
        alt = _WORD_IDS[(h + i * 7919) % len(_WORD_IDS)]
        if all(alt != t for t, _ in out):
            out.append((alt, f32(lp - 0.5 * len(out))))
        i += 1
    return out


@dataclass(frozen=True, slots=True)
class Step:
    """One generated token of one choice."""

    token_id: int
    text: str  # text released to the client by this step (may be "" while held back)
    finished: bool
    finish_reason: str | None  # "length" | "stop" | None
    stop_reason: str | None  # the stop string that matched


@dataclass(slots=True)
class Decoder:
    """Generates one choice token by token, honouring ``max_tokens`` and ``stop`` strings.

    Text that could be the start of a stop string is held back until disambiguated, as vLLM does,
    so streamed text never contains a partial stop string.
    """

    ctx: Context  # the context before the next token
    choice: int
    max_tokens: int
    stop: tuple[str, ...] = ()
    include_stop_str: bool = False
    first_token: int | None = None  # a token received from a remote prefill
    token_ids: list[int] = field(default_factory=list)
    contexts: list[Context] = field(default_factory=list)  # the context before each token
    text: str = ""
    sent: int = 0
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: str | None = None

    def next_token(self) -> int:
        if not self.token_ids and self.first_token is not None:
            return self.first_token
        return token_at(self.ctx, self.choice)

    def step(self) -> Step:
        if self.finished:
            raise RuntimeError("decoder already finished")
        tid = self.next_token()
        self.token_ids.append(tid)
        self.contexts.append(self.ctx)
        self.ctx = self.ctx.advance(tid)
        prev_len = len(self.text)
        self.text += token_text(tid)
        if self.stop:
            hold = max(len(s) for s in self.stop) - 1
            start = max(0, prev_len - hold)
            for s in self.stop:
                idx = self.text.find(s, start)
                if idx != -1:
                    end = idx + len(s) if self.include_stop_str else idx
                    self.text = self.text[:end]
                    return self._finish(tid, "stop", s)
        if len(self.token_ids) >= self.max_tokens:
            return self._finish(tid, "length", None)
        release_to = len(self.text) - (max(len(s) for s in self.stop) - 1 if self.stop else 0)
        if release_to > self.sent:
            delta = self.text[self.sent : release_to]
            self.sent = release_to
        else:
            delta = ""
        return Step(tid, delta, False, None, None)

    def _finish(self, tid: int, reason: str, stop_reason: str | None) -> Step:
        self.finished = True
        self.finish_reason = reason
        self.stop_reason = stop_reason
        delta = self.text[self.sent :]
        self.sent = len(self.text)
        return Step(tid, delta, True, reason, stop_reason)
