"""A chat request -> the text of a Hugging Face chat template, rendered the way transformers'
``apply_chat_template`` renders it for vLLM (pure: no I/O - the template source is passed in; only
``strftime_now`` reads the clock).

- a jinja2 ``ImmutableSandboxedEnvironment`` with ``trim_blocks``/``lstrip_blocks`` and
  ``loopcontrols``, the ``raise_exception``/``strftime_now`` globals, a ``tojson`` filter that does
  not escape HTML and the ``{% generation %}`` tag;
- the special tokens (``bos_token``, ``eos_token``, ...) as template variables;
- ``add_generation_prompt``, ``continue_final_message`` (transformers' tag trick),
  ``chat_template_kwargs``, ``reasoning_effort`` -> ``enable_thinking``;
- each message's content as vLLM passes it (:mod:`motor_coordinator.hf_content_format`).

Errors: :class:`Unsupported` - the request is valid for the engine but its text cannot be
reproduced here; anything the template itself raises (``raise_exception``, a broken template)
passes through as jinja2's own error. Needs ``jinja2`` (the ``tokenizers`` extra), imported when a
template is compiled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from motor_coordinator.hf_content_format import ContentFormat, detect_content_format

_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# Request fields that change the prompt in ways this module does not reproduce.
_UNSUPPORTED_CHAT = ("tools", "chat_template", "truncate_prompt_tokens", "mm_processor_kwargs")
_RESERVED_KWARGS = frozenset({"chat_template", "tokenize", "messages", "tools", "documents",
                              "add_generation_prompt", "continue_final_message"})
_BILLING_HEADER = "x-anthropic-billing-header"


class Unsupported(Exception):
    """The request is valid for the engine, but its ids cannot be reproduced here."""


def _generation_tag() -> type:
    """transformers' ``{% generation %}...{% endgeneration %}`` (marks assistant text for training
    masks): rendered as its body, which is all it does when not tracking."""
    import jinja2.ext
    from jinja2 import nodes

    class Generation(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    return Generation


def _environment() -> Any:
    """transformers' sandbox for chat templates."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_generation_tag(), jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


class ChatTemplate:
    """A compiled chat template (jinja2.TemplateError if *source* does not compile) and the
    special tokens it sees as variables."""

    def __init__(self, source: str, special: Mapping[str, str]) -> None:
        env = _environment()
        self.source = source
        self.special = special
        self._template = env.from_string(source)
        self.content_format: ContentFormat = detect_content_format(env, source)

    def render(self, body: Mapping[str, Any]) -> str:
        """The template's text for a chat request *body*; Unsupported when it cannot be reproduced."""
        if any(body.get(k) is not None for k in _UNSUPPORTED_CHAT):
            raise Unsupported("a request field changes the prompt")
        add_gen = body.get("add_generation_prompt", True)
        cont = body.get("continue_final_message", False)
        if not isinstance(add_gen, bool) or not isinstance(cont, bool) or (add_gen and cont):
            raise Unsupported("the engine refuses these flags")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise Unsupported("no messages")
        conversation = [_message(m, self.content_format) for m in messages]
        kwargs = _template_kwargs(body)
        final = _mark_final(conversation) if cont else ""
        text: str = self._template.render(
            messages=conversation, tools=None, documents=body.get("documents"), add_generation_prompt=add_gen,
            **{**self.special, **kwargs},
        )
        return _cut_at_final(text, final) if cont else text


def _template_kwargs(body: Mapping[str, Any]) -> dict[str, Any]:
    """The extra template variables a request sets: ``chat_template_kwargs``, and
    ``reasoning_effort`` (which also sets ``enable_thinking`` unless given)."""
    kwargs: dict[str, Any] = {}
    user = body.get("chat_template_kwargs")
    if user is not None:
        if not isinstance(user, Mapping) or any(k in _RESERVED_KWARGS for k in user):
            raise Unsupported("chat_template_kwargs the engine refuses or we do not reproduce")
        kwargs.update(user)
    effort = body.get("reasoning_effort")
    if effort is not None:
        kwargs["reasoning_effort"] = effort
        if "enable_thinking" not in kwargs:
            kwargs["enable_thinking"] = effort != "none"
    return kwargs


def _mark_final(conversation: list[dict[str, Any]]) -> str:
    """continue_final_message: tag the end of the last message's text (a string, or its last text
    part; *conversation* is a copy) so the render can be cut there; returns that text."""
    last = conversation[-1]
    content = last.get("content")
    if isinstance(content, str):
        last["content"] = content + _CONTINUE_TAG
        return content
    texts = [p for p in (content or ()) if "text" in p]
    if not texts:
        raise Unsupported("no text to continue")
    final: str = texts[-1]["text"]
    texts[-1]["text"] = final + _CONTINUE_TAG
    return final


def _cut_at_final(text: str, final: str) -> str:
    """The rendered *text* up to the tag :func:`_mark_final` put after the final message's text."""
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in text or tag not in text:
        raise Unsupported("the template dropped the final message")
    at = text.rindex(tag)
    return text[:at] if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()


def _message(m: Any, content_format: ContentFormat) -> dict[str, Any]:
    """One message as vLLM hands it to the template (text only; no tool calls), a new dict."""
    if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
        raise Unsupported("a malformed message")
    role = m["role"]
    if role == "developer" or any(k not in ("role", "content", "name") for k in m):
        raise Unsupported("a message field we do not reproduce")
    content = m.get("content")
    if content is None:
        texts: list[str] = []
    elif isinstance(content, str):
        texts = [content]
    elif isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, Mapping) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise Unsupported("a non-text content part")
            texts.append(part["text"])
    else:
        raise Unsupported("content of an unknown type")
    if role == "system":  # vLLM drops Claude Code's per-request attribution line (and an empty rest)
        kept = []
        for t in texts:
            if t.startswith(_BILLING_HEADER):
                t = t.partition("\n")[2]
                if not t:
                    continue
            kept.append(t)
        texts = kept
    out: dict[str, Any] = {"role": role}
    if content_format == "openai":
        out["content"] = [{"type": "text", "text": t} for t in texts]
    else:
        out["content"] = "\n".join(texts)
    if isinstance(m.get("name"), str):
        out["name"] = m["name"]
    return out
