"""Reading an engine's model card from its /v1/models answer (pure)."""

from __future__ import annotations

import orjson

from motor_common.model_card import (
    MAX_BODY_BYTES,
    MAX_PERMISSIONS,
    ModelCard,
    card_json,
    parse_card,
)

# vLLM 0.32's /v1/models answer (fields as tests/realengine/test_vllm_vs_simulator.py checks them)
VLLM = {"object": "list", "data": [{
    "id": "tiny", "object": "model", "created": 1700000000, "owned_by": "vllm", "root": "/models/tiny",
    "parent": None, "max_model_len": 2048,
    "permission": [{"id": "modelperm-0123456789abcdef", "object": "model_permission", "created": 1700000001,
                    "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                    "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                    "organization": "*", "group": None, "is_blocking": False}],
}]}


def test_a_vllm_card_round_trips_to_the_fields_vllm_writes() -> None:
    card = parse_card(orjson.dumps(VLLM), "tiny")
    assert card is not None and (card.root, card.max_model_len, card.parent) == ("/models/tiny", 2048, None)
    src = VLLM["data"][0]  # type: ignore[index]
    assert card_json(card) == {k: src[k] for k in ("root", "parent", "max_model_len", "permission")}


def test_an_sglang_card_has_no_permission() -> None:
    body = {"object": "list", "data": [{"id": "m", "object": "model", "root": "/p/m", "max_model_len": 4096}]}
    assert parse_card(orjson.dumps(body), "m") == ModelCard("/p/m", 4096)


def test_other_models_junk_and_oversized_answers_give_no_card() -> None:
    assert parse_card(orjson.dumps(VLLM), "other") is None
    for junk in (b"", b"not json", b"[]", b'{"data": 3}', b'{"data": [{"id": "tiny"}]}',
                 b'{"data": [{"id": "tiny", "root": 5, "max_model_len": "x"}]}'):
        assert parse_card(junk, "tiny") is None, junk
    assert parse_card(b" " * (MAX_BODY_BYTES + 1), "tiny") is None


def test_fields_are_bounded() -> None:
    card = {"id": "m", "root": "r" * 5000, "max_model_len": 2**40, "parent": 7,
            "permission": [{"id": "p", "allow_view": "yes"}] * 100 + ["x"]}
    parsed = parse_card(orjson.dumps({"data": [card]}), "m")
    assert parsed is not None
    assert len(parsed.root) == 1024 and parsed.max_model_len == 2**32 - 1 and parsed.parent is None
    assert len(parsed.permission) == MAX_PERMISSIONS and parsed.permission[0].allow_view is False
