"""A Hugging Face tokenizer and chat template in the coordinator (``scheduler.kv_events.tokenizer:
hf``): the prompt token ids a real vLLM or SGLang engine will compute, without asking it.

Pure (no I/O; :mod:`motor_coordinator.hf_tokenizer_loader` reads the files). Needs the
``tokenizers`` extra (``pip install 'motor-pd[tokenizers]'``: Hugging Face ``tokenizers`` and
``jinja2``). The parts:

- :mod:`~motor_coordinator.hf_chat_template`: a chat request -> the template's text;
- :mod:`~motor_coordinator.hf_content_format`: how vLLM passes content to a template;
- :mod:`~motor_coordinator.hf_encoder`: text -> the first ``limit`` ids, with the piece cache.

How the engines tokenize (checked in their source; docs/kv-events.md):

- chat: the chat template is rendered the way transformers' ``apply_chat_template`` renders it,
  then encoded with ``add_special_tokens=False`` (vLLM's default for chat; the request may ask
  for True; SGLang always False);
- completions text: encoded with ``add_special_tokens=True`` (vLLM's default, the request may say
  otherwise; SGLang ``tokenizer.encode(text)``).

A request this cannot reproduce exactly (tools, a request-level chat template, images,
tool-call messages, ``truncate_prompt_tokens``, a ``developer`` role, ...) gets no ids: the policy
then falls back to the ring, which is never wrong, only less precise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from motor_coordinator.hf_chat_template import ChatTemplate, Unsupported
from motor_coordinator.hf_content_format import ContentFormat
from motor_coordinator.hf_encoder import PieceEncoder


class HfTokenizer:
    """A tokenizer.json (the library's ``Tokenizer``) plus chat template, giving at most ``limit``
    ids of a prompt. *added*: the added tokens a chat's text may be split at
    (:func:`motor_coordinator.hf_encoder.piecewise_added_tokens`); None encodes texts whole.
    jinja2.TemplateError when the template does not compile."""

    def __init__(self, tokenizer: Any, template_source: str | None, special: Mapping[str, str],
                 added: Mapping[str, int] | None = None, cache_entries: int = 4096) -> None:
        self._tok = tokenizer  # the library's Tokenizer (tests build other templates' HfTokenizer on it)
        self.special = dict(special)
        self.template_source = template_source
        self._encoder = PieceEncoder(tokenizer, added, cache_entries)
        self._chat = ChatTemplate(template_source, self.special) if template_source is not None else None
        self.content_format: ContentFormat = self._chat.content_format if self._chat else "string"

    # --- text -> ids ---------------------------------------------------------------------------
    @property
    def piecewise(self) -> bool:
        return self._encoder.piecewise

    @property
    def cache_entries(self) -> int:
        return self._encoder.cache_entries

    @cache_entries.setter
    def cache_entries(self, value: int) -> None:
        self._encoder.cache_entries = value

    def clear_cache(self) -> None:
        self._encoder.clear_cache()

    def encode(self, text: str, add_special_tokens: bool, limit: int) -> tuple[int, ...]:
        return self._encoder.encode(text, add_special_tokens, limit)

    def text_ids(self, body: Mapping[str, Any], text: str, limit: int) -> tuple[int, ...] | None:
        if body.get("truncate_prompt_tokens") is not None:
            return None  # vLLM keeps the prompt's *last* tokens: other blocks
        special = body.get("add_special_tokens", True)
        if not isinstance(special, bool):
            return None
        return self.encode(text, special, limit)

    # --- chat -> text -> ids -------------------------------------------------------------------
    def chat_ids(self, body: Mapping[str, Any], limit: int) -> tuple[int, ...] | None:
        try:
            text = self.render_chat(body)
        except Unsupported:
            return None
        except Exception:  # the template refused it (raise_exception) or broke: the engine answers
            return None
        special = body.get("add_special_tokens", False)
        if not isinstance(special, bool):
            return None
        return self.encode(text, special, limit)

    def render_chat(self, body: Mapping[str, Any]) -> str:
        """The chat template's text for a chat request, as transformers renders it for vLLM."""
        if self._chat is None:
            raise Unsupported("the tokenizer has no chat template")
        return self._chat.render(body)
