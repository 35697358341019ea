"""Bounds on OpenAI bodies shared by the HTTP front and the coordinator's Dispatch (pure)."""

from __future__ import annotations

import gzip
import zlib
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from motor_common.errors import InvalidArgument
from motor_common.openai_bounds import (
    MAX_JSON_CONTAINERS,
    PD_FIELDS,
    json_shape,
    load_object,
    too_deep,
)
from motor_common.openai_front.limits import (
    MAX_GZIP_MEMBERS,
    BodyTooLarge,
    HttpLimits,
    clean_request_id,
    decompress,
)
from motor_common.openai_front.openai import validate_body
from motor_coordinator.request import parse_body


def deep(depth: int) -> bytes:
    return b'{"model": "m", "prompt": "p", "x": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def test_depth_is_counted_in_levels_of_objects_and_arrays() -> None:
    assert not too_deep(deep(64), 64)
    assert too_deep(deep(65), 64)
    many_flat = orjson.dumps({"messages": [{"role": "user", "content": "x"}] * 500})
    assert not too_deep(many_flat, 3)


def test_brackets_inside_strings_do_not_count() -> None:
    text = orjson.dumps({"model": "m", "prompt": ["[[[{{{", "\\", '"]]]\\"[[[', "", "{"], "x": "\\\""})
    assert json_shape(text, 2, max_containers=2) is None  # an object holding a list
    assert json_shape(text, 1, max_containers=2) == "JSON_TOO_DEEP"
    assert json_shape(text, 2, max_containers=1) == "JSON_TOO_MANY_CONTAINERS"


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _containers(value: Any) -> int:
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return int(isinstance(value, dict | list)) + sum(map(_containers, children))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(alphabet='[]{}"\\ax,:\n'),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(alphabet='[]{}"\\b'), inner, max_size=4),
    max_leaves=40)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(_JSON, st.integers(min_value=1, max_value=8), st.integers(min_value=1, max_value=30))
def test_the_byte_scan_agrees_with_the_parsed_object(value: Any, max_depth: int, max_containers: int) -> None:
    text = orjson.dumps(value)
    want = ("JSON_TOO_MANY_CONTAINERS" if _containers(value) > max_containers
            else "JSON_TOO_DEEP" if _depth(value) > max_depth else None)
    assert json_shape(text, max_depth, max_containers) == want


def test_a_gzip_bomb_of_empty_arrays_is_refused_before_any_object_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """4 MiB of ``[],`` (4 KiB gzipped) is 1.4 M lists once parsed (~80 MB, seconds of the event
    loop): refused from its bytes, by the front and by the coordinator's Dispatch, unparsed."""
    raw = decompress(gzip.compress(b'{"model":"m","prompt":[' + b"[]," * 1_398_000 + b"[]]}"), "gzip", 4 * 1024 * 1024)
    parsed: list[bytes] = []
    monkeypatch.setattr(orjson, "loads", lambda b: parsed.append(b))
    for check in (lambda: validate_body(raw, "completions"), lambda: parse_body("completions", raw)):
        with pytest.raises(InvalidArgument) as err:
            check()
        assert err.value.reason == "JSON_TOO_MANY_CONTAINERS"
        assert f"at most {MAX_JSON_CONTAINERS}" in str(err.value)
    assert parsed == []


def test_a_large_but_legal_body_is_parsed() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "[{"}]}] * 30_000,
            "x": orjson.loads(deep(64)[len(b'{"model": "m", "prompt": "p", "x": '):-1])}
    assert load_object(orjson.dumps(body)) == body


@pytest.mark.parametrize("depth", [65, 254, 255, 1100])
def test_dispatch_refuses_deep_bodies_that_the_engine_client_could_not_reencode(depth: int) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_body("completions", deep(depth))
    assert err.value.reason == "JSON_TOO_DEEP"


def test_dispatch_refuses_long_models_and_pd_fields() -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_body("completions", orjson.dumps({"model": "m" * 9000, "prompt": "p"}))
    assert err.value.reason == "MODEL_TOO_LONG"
    for name in PD_FIELDS:
        with pytest.raises(InvalidArgument) as err:
            parse_body("completions", orjson.dumps({"model": "m", "prompt": "p", name: 1}))
        assert err.value.reason == "RESERVED_FIELD"
        assert err.value.metadata["param"] == name


@pytest.mark.parametrize("raw", [b"", b"[1]", b"{", b"\xff"])
def test_load_object_errors_are_invalid_argument(raw: bytes) -> None:
    with pytest.raises(InvalidArgument):
        load_object(raw)


def test_request_id_must_be_visible_ascii_within_the_bound() -> None:
    assert clean_request_id("abc-1:2/3", 128) == "abc-1:2/3"
    for bad in (None, "", "a b", "é", "x\x01", "r" * 129):
        assert clean_request_id(bad, 128) is None


def test_decompress_bounds_output_and_accepts_zlib_and_raw_deflate() -> None:
    data = b"hello " * 100
    assert decompress(gzip.compress(data), "gzip", 1000) == data
    assert decompress(zlib.compress(data), "deflate", 1000) == data
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert decompress(raw.compress(data) + raw.flush(), "deflate", 1000) == data
    with pytest.raises(BodyTooLarge):
        decompress(gzip.compress(b"\0" * 10_000_000), "gzip", 1_000_000)
    for broken in (data, gzip.compress(data)[:-10]):
        with pytest.raises(ValueError):
            decompress(broken, "gzip", 1000)


def test_decompress_reads_every_gzip_member_and_refuses_trailing_bytes() -> None:
    """A body is what the client sent, all of it: concatenated gzip members are read as gzip(1)
    reads them, and bytes after the end of the compressed data are an error, never dropped."""
    a, b = b'{"model": "m", ', b'"prompt": "x"}'
    assert decompress(gzip.compress(a) + gzip.compress(b), "gzip", 1000) == a + b
    with pytest.raises(BodyTooLarge):  # the limit counts every member
        decompress(gzip.compress(b"x" * 600) + gzip.compress(b"y" * 600), "gzip", 1000)
    with pytest.raises(ValueError, match="trailing data"):
        decompress(gzip.compress(a + b) + b"GARBAGE" * 10, "gzip", 1000)
    with pytest.raises(ValueError, match="trailing data"):
        decompress(zlib.compress(a + b) + gzip.compress(b), "deflate", 1000)
    with pytest.raises(ValueError, match="truncated"):  # a second member cut short
        decompress(gzip.compress(a) + gzip.compress(b)[:-4], "gzip", 1000)
    with pytest.raises(ValueError, match="gzip members"):  # many tiny members: bounded work
        decompress(gzip.compress(b"") * (MAX_GZIP_MEMBERS + 1), "gzip", 1000)
    assert decompress(gzip.compress(b"") * (MAX_GZIP_MEMBERS - 1) + gzip.compress(a), "gzip", 1000) == a


@pytest.mark.parametrize("chars", [7, 257])
def test_request_id_length_outside_what_the_coordinator_takes_is_refused_at_start(chars: int) -> None:
    with pytest.raises(ValueError, match=r"max_request_id_chars must be in \[8, 256\]"):
        HttpLimits(max_request_id_chars=chars)
    assert HttpLimits(max_request_id_chars=256).max_request_id_chars == 256
