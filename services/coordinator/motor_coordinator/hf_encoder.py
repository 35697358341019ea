"""Text -> the first ``limit`` token ids with a Hugging Face ``tokenizers.Tokenizer``, bounded work
(pure: no I/O; the library object is passed in).

- A long text is encoded as a prefix only, grown until it holds ``limit + CUT_SLACK`` ids.
- Text encoded without special tokens (a rendered chat) is split at the tokenizer's added tokens
  (``<|im_start|>``, ``</s>``, ...) and each piece's ids are kept in a bounded LRU: a multi-turn
  chat re-sends its system prompt and history, and only its new pieces are encoded. Exact by the
  library's own rule (it encodes the pieces between added tokens independently), and used only
  when the tokenizer.json makes it so (:func:`piecewise_added_tokens`).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

# Tokens re-encoded past a cut: a cut in the text changes at most the tokens near it (pre-tokenized
# BPE / Unigram / WordPiece), so the first ``limit`` ids of a longer prefix are the whole text's.
CUT_SLACK = 64
CHARS_PER_TOKEN = 6  # first guess of how much text holds `limit` tokens (doubled until it does)

# Pre-tokenizers / normalizers that treat every piece between two added tokens on its own, so a
# piece encoded alone gives the ids it gets inside the whole text. Not Metaspace with
# prepend_scheme "first" (only the text's first piece gets the prefix).
_PIECEWISE_PRE = frozenset({"ByteLevel", "Split", "Digits", "Punctuation", "Whitespace", "WhitespaceSplit",
                            "BertPreTokenizer", "CharDelimiterSplit", "UnicodeScripts", "Metaspace"})


def _pre_ok(pre: Any) -> bool:
    if pre is None:
        return True
    if not isinstance(pre, Mapping) or pre.get("type") not in _PIECEWISE_PRE | {"Sequence"}:
        return False
    if pre["type"] == "Sequence":
        return all(_pre_ok(p) for p in pre.get("pretokenizers") or ())
    if pre["type"] == "Metaspace":
        return pre.get("prepend_scheme", "always") in ("always", "never")
    return True


def piecewise_added_tokens(spec: Mapping[str, Any]) -> dict[str, int] | None:
    """The added tokens (content -> id) a tokenizer.json splits its input on before anything else,
    when encoding the pieces between them one by one is exact for it; else None.

    Exact when every added token is matched on the raw text as it is (no lstrip/rstrip/single_word,
    not normalized - or no normalizer) and the pre-tokenizer treats each piece on its own: the
    library then encodes each piece independently too."""
    added = spec.get("added_tokens") or []
    normalizer = spec.get("normalizer")
    out: dict[str, int] = {}
    for t in added:
        if not isinstance(t, Mapping) or not isinstance(t.get("content"), str) or not t["content"]:
            return None
        if t.get("lstrip") or t.get("rstrip") or t.get("single_word"):
            return None
        if normalizer is not None and t.get("normalized"):
            return None
        out[t["content"]] = int(t["id"])
    if not out or not _pre_ok(spec.get("pre_tokenizer")):
        return None
    return out


class PieceEncoder:
    """*tokenizer* (anything with the library's ``encode(text, add_special_tokens=)``), encoding at
    most ``limit`` ids of a text; piece by piece between the *added* tokens when given.

    The event loop and the tokenize thread (tokenize_offload.py) share one encoder: the piece
    cache's updates are locked, the encoding (which releases the GIL) is not."""

    MAX_CACHED_CHARS = 64 * 1024  # longer pieces are encoded every time, never kept

    def __init__(self, tokenizer: Any, added: Mapping[str, int] | None = None, cache_entries: int = 4096) -> None:
        self._tok = tokenizer
        self._added = dict(added or {})
        self._split = (re.compile("|".join(re.escape(c) for c in sorted(self._added, key=len, reverse=True)))
                       if self._added else None)
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._cache_lock = threading.Lock()
        self.cache_entries = cache_entries

    @property
    def piecewise(self) -> bool:
        return self._split is not None

    def clear_cache(self) -> None:
        with self._cache_lock:
            self._cache.clear()

    def encode(self, text: str, add_special_tokens: bool, limit: int) -> tuple[int, ...]:
        """The first *limit* ids of *text*: only a prefix of a long text is encoded (grown until it
        holds ``limit + CUT_SLACK`` ids, so the cut cannot change the ids kept)."""
        if self._split is not None and not add_special_tokens:
            return self._encode_pieces(text, limit)
        return self._encode_prefix(text, add_special_tokens, limit)

    def _encode_pieces(self, text: str, limit: int) -> tuple[int, ...]:
        out: list[int] = []
        for piece, token in self._pieces(text):
            out += self._piece_ids(piece, limit - len(out)) if piece else ()
            if token is not None:
                out.append(self._added[token])
            if len(out) >= limit:
                break
        return tuple(out[:limit])

    def _pieces(self, text: str) -> Iterable[tuple[str, str | None]]:
        """(text before an added token, the token), ..., (the rest, None)."""
        assert self._split is not None
        pos = 0
        for m in self._split.finditer(text):
            yield text[pos:m.start()], m.group()
            pos = m.end()
        yield text[pos:], None

    def _piece_ids(self, piece: str, need: int) -> tuple[int, ...]:
        with self._cache_lock:
            hit = self._cache.get(piece)
            if hit is not None:
                self._cache.move_to_end(piece)
                return hit
        if len(piece) > self.MAX_CACHED_CHARS:
            return self._encode_prefix(piece, False, need)
        ids = tuple(self._tok.encode(piece, add_special_tokens=False).ids)
        with self._cache_lock:
            self._cache[piece] = ids
            if len(self._cache) > self.cache_entries:
                self._cache.popitem(last=False)
        return ids

    def _encode_prefix(self, text: str, add_special_tokens: bool, limit: int) -> tuple[int, ...]:
        cut = limit * CHARS_PER_TOKEN + 256
        while True:
            if cut >= len(text):
                return tuple(self._tok.encode(text, add_special_tokens=add_special_tokens).ids[:limit])
            ids = self._tok.encode(text[:cut], add_special_tokens=add_special_tokens).ids
            if len(ids) >= limit + CUT_SLACK:
                return tuple(ids[:limit])
            cut *= 2
