"""Deterministic toy tokenizer and chat template of motor-sim (pure, no I/O), shared with the
coordinator so that its kv_events policy hashes the very token ids a simulator engine caches.

Words and punctuation marks are tokens; a token id is the CRC-32 of its text (31 bits), so the
same text always yields the same ids in every process, and generated words (see ``generator``)
re-tokenize to the ids they were generated as.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from itertools import islice
from typing import Any

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def token_id(piece: str) -> int:
    """The id of one token text."""
    return zlib.crc32(piece.encode()) & 0x7FFFFFFF


def encode(text: str, limit: int | None = None) -> list[int]:
    """Split ``text`` into word/punctuation tokens and return their ids; with *limit*, stop after
    that many (the work stays bounded however long the text is)."""
    if limit is None:
        return [token_id(piece) for piece in _TOKEN_RE.findall(text)]
    return [token_id(m.group()) for m in islice(_TOKEN_RE.finditer(text), limit)]


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    raise ValueError("message content must be a string or a list of content parts")


def render_chat(messages: Iterable[Mapping[str, Any]], add_generation_prompt: bool = True,
                continue_final_message: bool = False) -> str:
    """The simulator's fixed chat template: ``<|role|>\\ncontent\\n`` per message.

    ``continue_final_message`` (vLLM's flag): the last message is left open (no closing newline) so
    the model continues it: a partial assistant answer renders as the generation prompt followed
    by that text, exactly the context the uninterrupted answer had at that point."""
    out: list[str] = []
    for message in messages:
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise ValueError("every message needs a string 'role'")
        out.append(f"<|{role}|>\n{_content_text(message.get('content'))}\n")
    if continue_final_message and out:
        out[-1] = out[-1][:-1]
    elif add_generation_prompt:
        out.append("<|assistant|>\n")
    return "".join(out)


def count(ids: Sequence[int]) -> int:
    return len(ids)
