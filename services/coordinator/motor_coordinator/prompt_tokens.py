"""The prompt's token ids as the engine will see them, for the kv_events policy (pure, no I/O).

Where they come from (``scheduler.kv_events.tokenizer``, docs/kv-events.md):

- a completions prompt given as token ids: those ids, exact for any engine (always used);
- ``simulator``: text and chat prompts through motor-sim's own tokenizer and chat template
  (:mod:`motor_common.toy_tokenizer`), exact for motor-sim engines;
- ``hf``: text and chat prompts through a Hugging Face tokenizer and chat template
  (:mod:`motor_coordinator.hf_tokenizer`, ``tokenizer_path``), exact for real vLLM and SGLang
  engines serving that model (requests it cannot reproduce get no ids);
- ``none``: text and chat prompts have no ids (the policy then falls back to the ring).

At most ``limit`` tokens are produced: only leading full blocks are hashed, and the work per
request stays bounded whatever the prompt's size.

:class:`PromptTokens` (what the coordinator uses) keeps the ids of recently seen chat messages
(a bounded LRU): a multi-turn chat re-sends its system prompt and history every turn, and the
template renders each message on its own line, so the ids of a conversation are the ids of its
messages laid end to end — exact, and each message is tokenized once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from motor_common import toy_tokenizer
from motor_coordinator.request import CHAT, ParsedRequest

if TYPE_CHECKING:
    from motor_coordinator.hf_tokenizer import HfTokenizer

TokenizerName = Literal["none", "simulator", "hf"]
TOKENIZERS: tuple[str, ...] = ("none", "simulator", "hf")


def prompt_token_ids(
    req: ParsedRequest, tokenizer: TokenizerName, limit: int, hf: HfTokenizer | None = None
) -> tuple[int, ...] | None:
    """The first *limit* prompt token ids, or None when they cannot be known here (``hf`` needs
    the loaded tokenizer *hf*)."""
    if req.api == CHAT:
        if tokenizer == "hf" and hf is not None:
            return hf.chat_ids(req.body, limit)
        if tokenizer != "simulator":
            return None
        return _chat_ids(req.body, limit)
    prompt = req.body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]  # a batch of id lists: the first prompt decides
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return _ids(prompt, limit)
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]  # a batch of texts
    if isinstance(prompt, str) and tokenizer == "simulator":
        return tuple(toy_tokenizer.encode(prompt, limit))
    if isinstance(prompt, str) and tokenizer == "hf" and hf is not None:
        return hf.text_ids(req.body, prompt, limit)
    return None


def _ids(prompt: Sequence[Any], limit: int) -> tuple[int, ...] | None:
    head = prompt[:limit]
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in head):
        return None  # the engine will refuse it; no routing opinion
    return tuple(head)


def _chat_ids(body: Any, limit: int) -> tuple[int, ...] | None:
    messages = body.get("messages")
    cont = bool(body.get("continue_final_message", False))
    try:
        text = toy_tokenizer.render_chat(
            messages, bool(body.get("add_generation_prompt", True)), continue_final_message=cont
        )
    except (ValueError, AttributeError, TypeError):
        return None  # the engine answers the error; no routing opinion
    return tuple(toy_tokenizer.encode(text, limit))


class PromptTokens:
    """:func:`prompt_token_ids` with a bounded LRU of per-message token ids (chat prompts, only
    with the ``simulator`` tokenizer, whose template is known to render each message on its own;
    an arbitrary Hugging Face template is rendered and encoded whole, bounded by ``limit``)."""

    MAX_CACHED_CHARS = 64 * 1024  # longer messages are tokenized every time, never kept

    def __init__(
        self, tokenizer: TokenizerName, limit: int, cache_entries: int = 4096, hf: HfTokenizer | None = None,
        hf_models: Mapping[str, HfTokenizer] | None = None,
    ) -> None:
        if tokenizer == "hf" and hf is None and not hf_models:
            raise ValueError("the hf tokenizer needs a loaded HfTokenizer")
        self.tokenizer: TokenizerName = tokenizer
        self.hf = hf  # every model's, unless hf_models names the request's model
        self.hf_models: Mapping[str, HfTokenizer] = hf_models or {}
        self.limit = limit
        self.cache_entries = cache_entries
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()

    def __call__(self, req: ParsedRequest) -> tuple[int, ...] | None:
        if req.api != CHAT or self.tokenizer != "simulator":
            return prompt_token_ids(req, self.tokenizer, self.limit, self.hf_models.get(req.model, self.hf))
        body = req.body
        cont = bool(body.get("continue_final_message", False))
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        try:
            pieces = _pieces(messages, bool(body.get("add_generation_prompt", True)), cont)
        except (ValueError, AttributeError, TypeError):
            return None
        out: list[int] = []
        for piece in pieces:
            out += self._ids(piece)
            if len(out) >= self.limit:
                return tuple(out[: self.limit])
        return tuple(out)

    def _ids(self, piece: str) -> tuple[int, ...]:
        hit = self._cache.get(piece)
        if hit is not None:
            self._cache.move_to_end(piece)
            return hit
        ids = tuple(toy_tokenizer.encode(piece, self.limit))
        if len(piece) <= self.MAX_CACHED_CHARS:
            self._cache[piece] = ids
            if len(self._cache) > self.cache_entries:
                self._cache.popitem(last=False)
        return ids


def _pieces(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool, cont: bool) -> list[str]:
    """The chat template's text, one piece per message: no token spans two pieces (each ends with
    a newline, the next starts with ``<``), so their ids laid end to end are the whole prompt's."""
    pieces = [toy_tokenizer.render_chat([m], add_generation_prompt=False) for m in messages]
    if cont and pieces:
        pieces[-1] = pieces[-1][:-1]
    elif add_generation_prompt:
        pieces.append(toy_tokenizer.render_chat([], add_generation_prompt=True))
    return pieces
