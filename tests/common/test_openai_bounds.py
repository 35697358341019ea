"""Bounds on OpenAI bodies shared by the HTTP front and the coordinator's Dispatch (pure)."""

from __future__ import annotations

import gzip
import zlib

import orjson
import pytest

from motor_common.errors import InvalidArgument
from motor_common.openai_bounds import PD_FIELDS, load_object, too_deep
from motor_common.openai_front.limits import (
    MAX_GZIP_MEMBERS,
    BodyTooLarge,
    HttpLimits,
    clean_request_id,
    decompress,
)
from motor_coordinator.request import parse_body


def deep(depth: int) -> bytes:
    return b'{"model": "m", "prompt": "p", "x": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def test_depth_is_counted_in_levels_of_objects_and_arrays() -> None:
    assert not too_deep(deep(64), orjson.loads(deep(64)), 64)
    assert too_deep(deep(65), orjson.loads(deep(65)), 64)
    many_flat = orjson.dumps({"messages": [{"role": "user", "content": "x"}] * 500})
    assert not too_deep(many_flat, orjson.loads(many_flat), 3)


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
