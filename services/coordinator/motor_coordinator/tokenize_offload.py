"""Long prompts are tokenized off the event loop (the kv_events policy's ``tokenizer: hf``).

Encoding a new 50 k-character prompt costs the Hugging Face tokenizer 10-30 ms of CPU
(``bench/prompt_tokens.py``); on the event loop that is 10-30 ms during which no other request of
this coordinator moves. The ``tokenizers`` library releases the GIL while it encodes, so one
worker thread takes those prompts and the loop keeps serving. Short prompts (most chats, and
every later turn of a conversation, whose messages are cached) stay on the loop: a thread hop
would cost more than their encoding.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from motor_coordinator.request import ParsedRequest

log = logging.getLogger(__name__)

# Prompts of at least this many characters go to the worker thread (≈ 4 k tokens: 2-4 ms uncached).
OFFLOAD_CHARS = 16 * 1024

TokenIds = Callable[[ParsedRequest], tuple[int, ...] | None]


def prompt_chars(body: Mapping[str, Any]) -> int:
    """The characters of text a request asks to tokenize: its messages' text, or its prompt text
    (pure; a rough size, counted without rendering)."""
    total = 0
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in messages:
            content = m.get("content") if isinstance(m, Mapping) else None
            if isinstance(content, str):
                total += len(content)
            elif isinstance(content, list):
                for part in content:
                    text = part.get("text") if isinstance(part, Mapping) else None
                    if isinstance(text, str):
                        total += len(text)
        return total
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]  # a batch of texts: the first decides (prompt_tokens.py)
    return len(prompt) if isinstance(prompt, str) else 0


class TokenizeOffload:
    """One worker thread for the long prompts; :meth:`close` on shutdown."""

    def __init__(self, threshold_chars: int = OFFLOAD_CHARS) -> None:
        self.threshold_chars = threshold_chars
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="motor-tokenize")

    def wants(self, req: ParsedRequest) -> bool:
        return prompt_chars(req.body) >= self.threshold_chars

    async def run(self, token_ids: TokenIds, req: ParsedRequest) -> tuple[int, ...] | None:
        return await asyncio.get_running_loop().run_in_executor(self._executor, token_ids, req)

    def close(self) -> None:
        """No new work; a prompt being encoded finishes in its thread (bounded by
        ``max_prompt_tokens``), and nobody waits for it."""
        self._executor.shutdown(wait=False, cancel_futures=True)
