"""A Hugging Face tokenizer and chat template in the coordinator (``scheduler.kv_events.tokenizer:
hf``): the prompt token ids a real vLLM or SGLang engine will compute, without asking it.

Pure (no I/O after :func:`load_hf_tokenizer`). Needs the ``tokenizers`` extra
(``pip install 'motor-pd[tokenizers]'``: Hugging Face ``tokenizers`` and ``jinja2``).

How the engines tokenize (checked in their source; docs/kv-events.md):

- chat: the chat template is rendered the way transformers' ``apply_chat_template`` renders it
  (a jinja2 ``ImmutableSandboxedEnvironment`` with ``trim_blocks``/``lstrip_blocks``, the
  ``raise_exception``/``strftime_now`` globals and a ``tojson`` filter that does not escape HTML;
  ``bos_token``/``eos_token``/... from tokenizer_config.json), then encoded with
  ``add_special_tokens=False`` (vLLM's default for chat; the request may ask for True; SGLang
  always False);
- completions text: encoded with ``add_special_tokens=True`` (vLLM's default, the request may say
  otherwise; SGLang ``tokenizer.encode(text)``).

A request this module cannot reproduce exactly (tools, a request-level chat template, images,
tool-call messages, ``truncate_prompt_tokens``, a ``developer`` role, ...) gets no ids: the policy
then falls back to the ring, which is never wrong, only less precise.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from motor_common.errors import ConfigError

KEY = "scheduler.kv_events.tokenizer_path"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# Tokens re-encoded past a cut: a cut in the text changes at most the tokens near it (pre-tokenized
# BPE / Unigram / WordPiece), so the first ``limit`` ids of a longer prefix are the whole text's.
CUT_SLACK = 64
CHARS_PER_TOKEN = 6  # first guess of how much text holds `limit` tokens (doubled until it does)
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# Request fields that change the prompt in ways this module does not reproduce: no ids.
_UNSUPPORTED_CHAT = ("tools", "chat_template", "truncate_prompt_tokens", "mm_processor_kwargs")
_RESERVED_KWARGS = frozenset({"chat_template", "tokenize", "messages", "tools", "documents",
                              "add_generation_prompt", "continue_final_message"})
ContentFormat = Literal["string", "openai"]
_BILLING_HEADER = "x-anthropic-billing-header"


class Unsupported(Exception):
    """The request is valid for the engine, but its ids cannot be reproduced here."""


def _missing_extra(exc: ImportError) -> ConfigError:
    return ConfigError(
        f"scheduler.kv_events.tokenizer: 'hf' needs the Hugging Face tokenizers library and jinja2 "
        f"({exc.name or exc} is not installed): install the extra, pip install 'motor-pd[tokenizers]'"
    )


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])  # a serialized AddedToken
    return None


def _read_json(path: Path, key: str = KEY) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{key}: {path} must hold a JSON object")
    return data


def _pick_template(value: Any, where: Path, key: str = KEY) -> str | None:
    """tokenizer_config.json's ``chat_template``: a string, or a list of named ones ("default")."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, Mapping)}
        tpl = named.get("default")
        return tpl if isinstance(tpl, str) else None
    raise ConfigError(f"{key}: the chat_template in {where} is neither a string nor a list of named templates")


def detect_content_format(env: Any, source: str) -> ContentFormat:
    """vLLM's ``--chat-template-content-format auto`` (``vllm/renderers/hf.py``, same rules):
    "openai" (content passed as a list of parts) when the template loops over a message's
    content - directly, through a variable assigned from it, or through a macro parameter that
    receives it -, else "string" (parts joined by newlines). A template whose analysis fails is
    "string", as in vLLM."""
    try:
        return "openai" if _loops_over_content(env.parse(source)) else "string"
    except Exception:
        return "string"


def _loops_over_content(root: Any) -> bool:
    from jinja2 import nodes

    def is_var(n: Any, name: str) -> bool:
        return isinstance(n, nodes.Name) and n.ctx == "load" and n.name == name

    def is_attr(n: Any, name: str, key: str) -> bool:
        if isinstance(n, nodes.Getitem):
            return is_var(n.node, name) and isinstance(n.arg, nodes.Const) and n.arg.value == key
        return isinstance(n, nodes.Getattr) and is_var(n.node, name) and n.attr == key

    def reaches(n: Any, name: str, key: str | None = None) -> bool:
        """*n* is the variable (or its *key*), maybe through filters, tests or a slice."""
        if isinstance(n, nodes.Filter):
            return n.node is not None and reaches(n.node, name, key)
        if isinstance(n, nodes.Test):
            return reaches(n.node, name, key)
        if isinstance(n, nodes.Getitem) and isinstance(n.arg, nodes.Slice):
            return reaches(n.node, name, key)
        return is_attr(n, name, key) if key else is_var(n, name)

    def target(loop: Any) -> str:
        if not isinstance(loop.target, nodes.Name):
            raise ValueError("a loop target that is not a name")  # vLLM: analysis fails
        return str(loop.target.name)

    # names holding the messages (assigned from them, transitively), then the loop variables over them
    lists, todo = ["messages"], ["messages"]
    while todo:
        name = todo.pop(0)
        for a in root.find_all(nodes.Assign):
            if reaches(a.node, name):
                if not isinstance(a.target, nodes.Name):
                    raise ValueError("an assignment target that is not a name")
                lists.append(a.target.name)
                if a.target.name != name:
                    todo.append(a.target.name)
    items = [target(loop) for loop in root.find_all(nodes.For) if any(reaches(loop.iter, v) for v in lists)]
    # macro parameters that receive a message's content, and the loops inside macros
    params_of: dict[int, set[str]] = {}
    in_macro: set[int] = set()
    for macro in root.find_all(nodes.Macro):
        names = [a.name for a in macro.args]
        params: set[str] = set()
        for call in root.find_all(nodes.Call):
            if not (isinstance(call.node, nodes.Name) and call.node.name == macro.name):
                continue
            for i, arg in enumerate(call.args):
                if i < len(names) and any(reaches(arg, v, "content") for v in items):
                    params.add(names[i])
            for kw in call.kwargs:
                if kw.key in names and any(reaches(kw.value, v, "content") for v in items):
                    params.add(kw.key)
        for loop in macro.find_all(nodes.For):
            in_macro.add(id(loop))
            if params:
                params_of[id(loop)] = params
    for loop in root.find_all(nodes.For):
        if any(reaches(loop.iter, v, "content") for v in items):
            target(loop)
            return True
        it = loop.iter
        if isinstance(it, nodes.Name) and it.name in params_of.get(id(loop), ()):
            target(loop)
            return True
        if id(loop) not in in_macro and isinstance(it, nodes.Name) and it.name == "content":
            target(loop)
            return True
    return False


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


class HfTokenizer:
    """A tokenizer.json plus chat template, encoding at most ``limit`` ids of a prompt.

    With *added* (see :func:`piecewise_added_tokens`), text encoded without special tokens (chat)
    is split at the added tokens the template put in (``<|im_start|>``, ``</s>``, ...) and the ids
    of each piece are kept in a bounded LRU: a multi-turn chat re-sends its system prompt and
    history, and only its new pieces are encoded. Exact by the library's own rule (it encodes the
    pieces between added tokens independently); the tests compare it with whole-text encoding."""

    MAX_CACHED_CHARS = 64 * 1024  # longer pieces are encoded every time, never kept

    def __init__(self, tokenizer: Any, template_source: str | None, special: Mapping[str, str],
                 added: Mapping[str, int] | None = None, cache_entries: int = 4096) -> None:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        self._tok = tokenizer
        self.special = dict(special)
        self._added = dict(added or {})
        self._split = (re.compile("|".join(re.escape(c) for c in sorted(self._added, key=len, reverse=True)))
                       if self._added else None)
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._cache_lock = threading.Lock()
        self.cache_entries = cache_entries
        self.template_source = template_source
        self.content_format: ContentFormat = "string"
        self._template: Any = None
        if template_source is not None:

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
            self._template = env.from_string(template_source)
            self.content_format = detect_content_format(env, template_source)

    # --- text -> ids ---------------------------------------------------------------------------
    @property
    def piecewise(self) -> bool:
        return self._split is not None

    def encode(self, text: str, add_special_tokens: bool, limit: int) -> tuple[int, ...]:
        """The first *limit* ids of *text*: only a prefix of a long text is encoded (grown until it
        holds ``limit + CUT_SLACK`` ids, so the cut cannot change the ids kept)."""
        if self._split is not None and not add_special_tokens:
            return self._encode_pieces(text, limit)
        return self._encode_prefix(text, add_special_tokens, limit)

    def _encode_pieces(self, text: str, limit: int) -> tuple[int, ...]:
        assert self._split is not None
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
        # The event loop and the tokenize thread (tokenize_offload.py) share the cache: its
        # updates are locked, the encoding (which releases the GIL) is not.
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
        if self._template is None:
            raise Unsupported("the tokenizer has no chat template")
        if any(body.get(k) is not None for k in _UNSUPPORTED_CHAT):
            raise Unsupported("a request field changes the prompt")
        add_gen = body.get("add_generation_prompt", True)
        cont = body.get("continue_final_message", False)
        if not isinstance(add_gen, bool) or not isinstance(cont, bool) or (add_gen and cont):
            raise Unsupported("the engine refuses these flags")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise Unsupported("no messages")
        conversation = [self._message(m) for m in messages]
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
        documents = body.get("documents")
        if cont:
            last = conversation[-1]
            content = last.get("content")
            if isinstance(content, str):
                final = content
                last["content"] = content + _CONTINUE_TAG
            else:  # parts (a copy, made by _message): the last text part is continued
                texts = [p for p in (content or ()) if "text" in p]
                if not texts:
                    raise Unsupported("no text to continue")
                final = texts[-1]["text"]
                texts[-1]["text"] = final + _CONTINUE_TAG
        text: str = self._template.render(
            messages=conversation, tools=None, documents=documents, add_generation_prompt=add_gen,
            **{**self.special, **kwargs},
        )
        if cont:
            tag = _CONTINUE_TAG.strip()
            if final.strip() not in text or tag not in text:
                raise Unsupported("the template dropped the final message")
            at = text.rindex(tag)
            text = text[:at] if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()
        return text

    def _message(self, m: Any) -> dict[str, Any]:
        """One message as vLLM hands it to the template (text only; no tool calls)."""
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
        if self.content_format == "openai":
            out["content"] = [{"type": "text", "text": t} for t in texts]
        else:
            out["content"] = "\n".join(texts)
        if isinstance(m.get("name"), str):
            out["name"] = m["name"]
        return out


def load_hf_tokenizer(path: str, key: str = KEY) -> HfTokenizer:
    """Load ``tokenizer.json`` (+ ``tokenizer_config.json``, ``special_tokens_map.json``,
    ``chat_template.jinja``/``chat_template.json`` when present) from a model directory, or from the
    directory of the tokenizer.json file *path* names. Local files only; a ConfigError naming the
    key (*key*) on any problem."""
    try:
        import jinja2
        import jinja2.ext
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise _missing_extra(exc) from exc
    if not path:
        raise ConfigError(f"{key} must name a model directory or its tokenizer.json when tokenizer is 'hf'")
    p = Path(path)
    if p.is_dir():
        directory, file = p, p / "tokenizer.json"
    elif p.is_file():
        directory, file = p.parent, p
    else:
        raise ConfigError(f"{key}: {path} does not exist")
    if not file.is_file():
        raise ConfigError(f"{key}: no tokenizer.json in {directory} (only fast tokenizers are supported)")
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as exc:  # the Rust library's own message (bad JSON, unknown model type, ...)
        raise ConfigError(f"{key}: cannot load {file}: {exc}") from exc
    added = piecewise_added_tokens(_read_json(file, key))
    cfg_file = directory / "tokenizer_config.json"
    cfg = _read_json(cfg_file, key) if cfg_file.is_file() else {}
    special: dict[str, str] = {}
    stm = directory / "special_tokens_map.json"
    for source in ((_read_json(stm, key) if stm.is_file() else {}), cfg):
        for name in SPECIAL_TOKENS:
            value = _token_text(source.get(name))
            if value is not None:
                special[name] = value
    template: str | None
    jinja_file, json_file = directory / "chat_template.jinja", directory / "chat_template.json"
    try:
        if jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        elif json_file.is_file():
            template = _pick_template(_read_json(json_file, key).get("chat_template"), json_file, key)
        else:
            template = _pick_template(cfg.get("chat_template"), cfg_file, key)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{key}: cannot read the chat template in {directory}: {exc}") from exc
    try:
        return HfTokenizer(tok, template, special, added)
    except jinja2.TemplateError as exc:
        raise ConfigError(f"{key}: the chat template in {directory} does not compile: {exc}") from exc


def first_text(prompt: Any) -> str | None:
    """A completions prompt's text (the first of a batch), or None."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else None


def load_hf_tokenizers(path: str, per_model: Mapping[str, str]) -> tuple[HfTokenizer | None, dict[str, HfTokenizer]]:
    """``tokenizer_path`` (every model's, unless listed; "" = none) and ``tokenizer_paths``
    (model -> its own), loaded; a ConfigError names the key of the one that failed."""
    default = load_hf_tokenizer(path) if path else None
    models = {model: load_hf_tokenizer(p, f"scheduler.kv_events.tokenizer_paths.{model}")
              for model, p in per_model.items()}
    return default, models
