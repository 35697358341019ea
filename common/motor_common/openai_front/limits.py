"""Limits of the OpenAI HTTP front (the ``limits`` section of ``motor-gateway``'s config and of the
coordinator's ``http`` section) and the pure checks that use them. docs/security.md lists them.

Everything a client controls is bounded here or by the engines: the body (size, encoding, JSON
depth, read time), the header phase (aiohttp's line/field limits and ``header_timeout_sec``), the
connection count, the ``model`` name and the ``X-Request-Id`` header. The prompt itself is bounded
by the body size and by the engine's ``max_model_len`` check (vLLM's 400).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from motor_common.openai_bounds import MAX_JSON_DEPTH, MAX_MODEL_CHARS
from motor_common.request_limits import MAX_NAME

MIB = 1024 * 1024
# Content-Encodings the front decodes (``decompress``); anything else is refused with 415.
ENCODINGS = frozenset({"gzip", "x-gzip", "deflate"})
_REQUEST_ID = re.compile(r"[\x21-\x7e]+")  # visible ASCII, no spaces or control bytes
# Largest non-streamed answer the front collects before sending it (a streamed one is relayed as it
# comes, under flow control); past it the request is stopped and answered 502 response_too_large.
# The largest gRPC message the Motor services accept (request_limits.MAX_BYTES).
MAX_ANSWER_BYTES = 64 * MIB


@dataclass(frozen=True)
class HttpLimits:
    # Largest request body (after decompression); bigger → 413, refused on Content-Length before
    # any byte of the body is read, and while reading for chunked or compressed bodies.
    max_body_bytes: int = 4 * MIB
    # Deepest nesting of JSON objects/arrays in a body (orjson serialises only 254 levels).
    max_json_depth: int = MAX_JSON_DEPTH
    # Longest `model` name.
    max_model_chars: int = MAX_MODEL_CHARS
    # Longest X-Request-Id kept; a longer one, or one with spaces, control or non-ASCII bytes, is
    # replaced with a fresh id (the response carries the id used).
    max_request_id_chars: int = 128
    # Seconds a connection may spend without a complete request head: a new connection, or an
    # idle kept-alive one (slow-header clients are cut off here).
    header_timeout_sec: float = 15.0
    # Seconds to receive a whole request body once its head arrived (408 after).
    body_timeout_sec: float = 30.0
    # Open client connections per process; more are answered 503 and closed at once.
    max_connections: int = 1024

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ValueError("limits.max_body_bytes must be >= 1024")
        if not 2 <= self.max_json_depth <= 250:
            raise ValueError("limits.max_json_depth must be in [2, 250]")
        if self.max_model_chars < 1:
            raise ValueError("limits.max_model_chars must be >= 1")
        if not 8 <= self.max_request_id_chars <= MAX_NAME:
            raise ValueError(f"limits.max_request_id_chars must be in [8, {MAX_NAME}]: the id travels to the "
                             f"coordinator as DispatchRequest.request_id, which takes at most {MAX_NAME} characters")
        if self.header_timeout_sec <= 0 or self.body_timeout_sec <= 0:
            raise ValueError("limits.header_timeout_sec and body_timeout_sec must be > 0")
        if self.max_connections < 1:
            raise ValueError("limits.max_connections must be >= 1")


def clean_request_id(value: str | None, max_chars: int) -> str | None:
    """*value* when it is a usable request id (1..max_chars visible ASCII characters), else None."""
    if not value or len(value) > max_chars or not _REQUEST_ID.fullmatch(value):
        return None
    return value


def encodings(header: str) -> list[str]:
    """The codings of a Content-Encoding header, lower-cased, in order."""
    return [c.strip().lower() for c in header.split(",") if c.strip()]


class BodyTooLarge(Exception):
    """The decompressed body exceeds the limit."""


# Gzip members (RFC 1952: concatenated gzip streams) read from one body.
MAX_GZIP_MEMBERS = 64


def deflate_wbits(first: bytes) -> int:
    """zlib's ``wbits`` for a ``deflate`` body starting with *first*: RFC 9110's deflate is
    zlib-wrapped (a header with the deflate method and its checksum), and some senders send raw
    deflate: accept both."""
    wrapped = first[:1] and (first[0] & 0x0F) == 8 and int.from_bytes(first[:2]) % 31 == 0
    return zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS


def decompress(data: bytes, coding: str, limit: int) -> bytes:
    """*data* decoded from *coding* (one of ``ENCODINGS``), producing at most *limit* bytes (a
    compression bomb stops there: ``BodyTooLarge``). Raises ``ValueError`` for data that is not
    valid or complete in that coding."""
    wbits = deflate_wbits(data) if coding == "deflate" else 16 + zlib.MAX_WBITS
    parts: list[bytes] = []
    size = 0
    rest = data
    for _ in range(MAX_GZIP_MEMBERS):
        d = zlib.decompressobj(wbits)
        try:
            part = d.decompress(rest, limit - size + 1)
        except zlib.error as exc:
            raise ValueError(str(exc)) from None
        size += len(part)
        if size > limit or d.unconsumed_tail:
            raise BodyTooLarge(limit)
        if not d.eof:
            raise ValueError("truncated")
        parts.append(part)
        rest = d.unused_data
        if not rest:
            return parts[0] if len(parts) == 1 else b"".join(parts)
        # What follows the end of the compressed data: only another gzip member (RFC 1952 2.2,
        # as gzip.decompress reads it); anything else would be silently dropped.
        if coding == "deflate" or rest[:2] != b"\x1f\x8b":
            raise ValueError(f"{len(rest)} bytes of trailing data after the end of the compressed body")
    raise ValueError(f"more than {MAX_GZIP_MEMBERS} gzip members")
