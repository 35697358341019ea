"""strict_proto: unknown fields are found wherever they are, by the one-pass check (messages that
came as at most FAST_CHECK_BYTES) and by the walk (larger ones, and to name them)."""

from __future__ import annotations

import pytest

from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.strict_proto import FAST_CHECK_BYTES, has_unknown_fields, unknown_field_paths
from tests.helpers import varint

UNKNOWN = b"\xf8\x06\x01"  # field 111, varint 1: in no Motor message


def _with_unknown(where: str, body: bytes = b"{}") -> cpb.DispatchManyRequest:
    """A one-request DispatchMany message with field 111 added at *where* (as a newer client's
    bytes would carry it)."""
    request = cpb.DispatchRequest(request_id="r", api=1, body=body).SerializeToString()
    if where == "request":
        request += UNKNOWN
    start = cpb.DispatchStart(timeout_ms=5, trace_context={"traceparent": "00-x"}).SerializeToString()
    start += b"\x0a" + varint(len(request)) + request
    if where == "start":
        start += UNKNOWN
    command = cpb.DispatchCommand(stream_id=1).SerializeToString() + b"\x12" + varint(len(start)) + start
    if where == "command":
        command += UNKNOWN
    data = b"\x0a" + varint(len(command)) + command
    if where == "top":
        data += UNKNOWN
    return cpb.DispatchManyRequest.FromString(data)



@pytest.mark.parametrize(("where", "path"), [
    ("top", "DispatchManyRequest.#111"),
    ("command", "DispatchManyRequest.commands[0].#111"),
    ("start", "DispatchManyRequest.commands[0].start.#111"),
    ("request", "DispatchManyRequest.commands[0].start.request.#111"),
])
@pytest.mark.parametrize("size", ["small", "large"])
def test_an_unknown_field_is_found_at_any_depth_in_small_and_large_messages(where: str, path: str, size: str) -> None:
    body = b"x" * (FAST_CHECK_BYTES + 1) if size == "large" else b"{}"
    msg = _with_unknown(where, body)
    wire = msg.ByteSize()
    assert (wire > FAST_CHECK_BYTES) == (size == "large")  # the walk alone / the one-pass check first
    assert has_unknown_fields(msg)
    assert unknown_field_paths(msg, wire_size=wire) == [path]
    assert unknown_field_paths(msg) == [path]  # no wire size: the walk


@pytest.mark.parametrize("size", ["small", "large"])
def test_a_message_without_unknown_fields_has_no_paths(size: str) -> None:
    body = b"x" * (FAST_CHECK_BYTES + 1) if size == "large" else b"{}"
    msg = _with_unknown("none", body)
    assert msg.commands[0].start.request.body == body and msg.commands[0].start.trace_context["traceparent"] == "00-x"
    assert not has_unknown_fields(msg)
    assert unknown_field_paths(msg, wire_size=msg.ByteSize()) == unknown_field_paths(msg) == []
    assert msg.ByteSize() == len(msg.SerializeToString())  # the check changed nothing in the message


def test_a_large_message_is_walked_without_the_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above FAST_CHECK_BYTES the one-pass check (a copy, and sizing that encodes the message)
    is not made: the walk's cost grows with the fields, not with a big prompt's bytes."""
    import motor_common.strict_proto as strict

    def refused(msg: object) -> bool:
        raise AssertionError("the one-pass check ran on a large message")

    monkeypatch.setattr(strict, "has_unknown_fields", refused)
    big = _with_unknown("request", b"x" * (4 * FAST_CHECK_BYTES))
    assert strict.unknown_field_paths(big, wire_size=big.ByteSize()) == ["DispatchManyRequest.commands[0].start.request.#111"]
    small = _with_unknown("none")
    with pytest.raises(AssertionError, match="one-pass check ran"):  # and it does run on a small one
        strict.unknown_field_paths(small, wire_size=small.ByteSize())
