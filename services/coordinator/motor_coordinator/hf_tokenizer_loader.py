"""Loading and checking a Hugging Face tokenizer directory for ``scheduler.kv_events.tokenizer:
hf`` (start-up and ``--check-config``): the only part of it that reads files. A missing
``tokenizers`` extra, a missing or bad file, a template that does not compile: a ConfigError
naming the key.

What is read, in transformers' order: ``tokenizer.json`` (required: fast tokenizers only),
``tokenizer_config.json`` and ``special_tokens_map.json`` (special tokens), and the chat template
from ``chat_template.jinja``, else ``chat_template.json``, else ``tokenizer_config.json`` (a named
list: ``default``). Local files only, read once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from motor_common.errors import ConfigError
from motor_coordinator.hf_encoder import piecewise_added_tokens
from motor_coordinator.hf_tokenizer import HfTokenizer

KEY = "scheduler.kv_events.tokenizer_path"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


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


def load_hf_tokenizers(path: str, per_model: Mapping[str, str]) -> tuple[HfTokenizer | None, dict[str, HfTokenizer]]:
    """``tokenizer_path`` (every model's, unless listed; "" = none) and ``tokenizer_paths``
    (model -> its own), loaded; a ConfigError names the key of the one that failed."""
    default = load_hf_tokenizer(path) if path else None
    models = {model: load_hf_tokenizer(p, f"scheduler.kv_events.tokenizer_paths.{model}")
              for model, p in per_model.items()}
    return default, models
