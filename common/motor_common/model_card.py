"""The engines' own model cards (pure): what ``GET /v1/models`` of an engine says about a model.

vLLM's card carries ``root`` (the model path), ``parent``, ``max_model_len`` and ``permission`` (a
list of ``model_permission`` objects); SGLang's has ``root`` and ``max_model_len``. The coordinator
learns one card per served model from one of its engines (``motor_coordinator.monitor``); its
ListModels carries the card (``Model`` fields 6-9) and the OpenAI front's ``/v1/models`` shows the
fields as vLLM writes them (:func:`card_json`).

Bounded: an answer above ``MAX_BODY_BYTES`` or a card with fields of the wrong type is ignored
(the model is then listed without them); strings are cut to ``MAX_TEXT`` characters, at most
``MAX_PERMISSIONS`` permission objects are kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

MAX_BODY_BYTES = 1 << 20
MAX_TEXT = 1024
MAX_PERMISSIONS = 16
MAX_MODEL_LEN = 2**32 - 1
_FLAGS = ("allow_create_engine", "allow_sampling", "allow_logprobs", "allow_search_indices", "allow_view",
          "allow_fine_tuning", "is_blocking")


@dataclass(frozen=True)
class Permission:
    id: str
    created: int
    allow_create_engine: bool = False
    allow_sampling: bool = False
    allow_logprobs: bool = False
    allow_search_indices: bool = False
    allow_view: bool = False
    allow_fine_tuning: bool = False
    organization: str = ""
    group: str | None = None
    is_blocking: bool = False


@dataclass(frozen=True)
class ModelCard:
    root: str
    max_model_len: int  # 0: the engine did not say
    parent: str | None = None
    permission: tuple[Permission, ...] = ()


def _text(value: Any) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _permission(raw: Any) -> Permission | None:
    if not isinstance(raw, Mapping):
        return None
    flags = {f: raw[f] for f in _FLAGS if isinstance(raw.get(f), bool)}
    return Permission(id=_text(raw.get("id")) or "", created=max(_int(raw.get("created")) or 0, 0), **flags,
                      organization=_text(raw.get("organization")) or "", group=_text(raw.get("group")))


def parse_card(body: bytes | str, model: str) -> ModelCard | None:
    """The card of *model* in an engine's ``/v1/models`` answer, or None (absent or malformed)."""
    if len(body) > MAX_BODY_BYTES:
        return None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    data = doc.get("data") if isinstance(doc, Mapping) else None
    if not isinstance(data, list):
        return None
    card = next((c for c in data if isinstance(c, Mapping) and c.get("id") == model), None)
    if card is None:
        return None
    root = _text(card.get("root"))
    length = _int(card.get("max_model_len"))
    if root is None and length is None:
        return None
    perms = card.get("permission")
    permission = tuple(p for p in (_permission(x) for x in perms[:MAX_PERMISSIONS]) if p is not None) \
        if isinstance(perms, list) else ()
    return ModelCard(root=root or model, max_model_len=min(max(length or 0, 0), MAX_MODEL_LEN),
                     parent=_text(card.get("parent")), permission=permission)


def card_json(card: ModelCard) -> dict[str, Any]:
    """The card's fields as vLLM writes them in a model object."""
    return {
        "root": card.root,
        "parent": card.parent,
        "max_model_len": card.max_model_len or None,
        "permission": [{
            "id": p.id, "object": "model_permission", "created": p.created,
            "allow_create_engine": p.allow_create_engine, "allow_sampling": p.allow_sampling,
            "allow_logprobs": p.allow_logprobs, "allow_search_indices": p.allow_search_indices,
            "allow_view": p.allow_view, "allow_fine_tuning": p.allow_fine_tuning,
            "organization": p.organization, "group": p.group, "is_blocking": p.is_blocking,
        } for p in card.permission],
    }
