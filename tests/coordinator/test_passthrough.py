"""Pass-through routing decisions and request checks (pure)."""

from __future__ import annotations

import pytest

from motor_common.domain import Role
from motor_common.errors import InvalidArgument
from motor_coordinator.passthrough import resolve_model, roles
from motor_coordinator.request import (
    DETOKENIZE,
    EMBEDDINGS,
    RESPONSES,
    TOKENIZE,
    VERSION,
    parse_body,
    parsed_request,
)


def test_responses_run_on_union_or_decode_and_the_others_prefer_union_then_prefill() -> None:
    assert roles(RESPONSES) == (Role.UNION, Role.DECODE)
    for api in (TOKENIZE, DETOKENIZE, EMBEDDINGS, VERSION):
        assert roles(api) == (Role.UNION, Role.PREFILL, Role.DECODE)


def test_a_missing_model_is_the_fleets_only_model_else_an_error_naming_them() -> None:
    assert resolve_model("m", ["a", "b"]) == "m"
    assert resolve_model("", ["only"]) == "only"
    with pytest.raises(InvalidArgument) as err:
        resolve_model("", ["b", "a"])
    assert err.value.reason == "MISSING_MODEL" and "(a, b)" in err.value.message


def test_passthrough_bodies_may_omit_the_model_but_not_their_own_fields() -> None:
    assert parsed_request(TOKENIZE, {"prompt": "x"}).model == ""
    assert parsed_request(TOKENIZE, {"messages": []}).api == TOKENIZE
    assert parsed_request(DETOKENIZE, {"tokens": [0, 2**63 - 1]}).path == "/detokenize"
    assert parsed_request(EMBEDDINGS, {"input": [[1, 2]]}).path == "/v1/embeddings"
    assert parsed_request(RESPONSES, {"input": "x", "stream": True}).stream
    v = parse_body(VERSION, b"")
    assert (v.method, v.path, dict(v.body)) == ("GET", "/version", {})
    for api, body, param in (
        (TOKENIZE, {"prompt": ["x"]}, "prompt"),
        (DETOKENIZE, {"tokens": [True]}, "tokens"),
        (DETOKENIZE, {"tokens": [2**63]}, "tokens"),
        (EMBEDDINGS, {"input": 3}, "input"),
        (RESPONSES, {"input": {"a": 1}}, "input"),
        (VERSION, {"model": "x"}, "body"),
        (TOKENIZE, {"model": "", "prompt": "x"}, "model"),
    ):
        with pytest.raises(InvalidArgument) as err:
            parsed_request(api, body)
        assert err.value.metadata.get("param") == param, (api, body)
