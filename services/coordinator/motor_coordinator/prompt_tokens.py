"""The prompt's token ids as the engine will see them, for the kv_events policy (pure, no I/O).

Where they come from (``scheduler.kv_events.tokenizer``, docs/kv-events.md):

- a completions prompt given as token ids: those ids, exact for any engine (always used);
- ``simulator``: text and chat prompts through motor-sim's own tokenizer and chat template
  (:mod:`motor_common.toy_tokenizer`), exact for motor-sim engines;
- ``none``: text and chat prompts have no ids (the policy then falls back to the ring).

At most ``limit`` tokens are produced: only leading full blocks are hashed, and the work per
request stays bounded whatever the prompt's size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from motor_common import toy_tokenizer
from motor_coordinator.request import CHAT, ParsedRequest

TokenizerName = Literal["none", "simulator"]
TOKENIZERS: tuple[str, ...] = ("none", "simulator")


def prompt_token_ids(req: ParsedRequest, tokenizer: TokenizerName, limit: int) -> tuple[int, ...] | None:
    """The first *limit* prompt token ids, or None when they cannot be known here."""
    if req.api == CHAT:
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
