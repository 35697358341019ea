"""Reject request messages that carry fields this server does not know.

Protobuf keeps unknown fields silently; Motor's contract is that a misspelled or unknown field is
an error, never dropped (a client built from a newer proto than the server gets told, instead of
its setting being ignored). The chassis runs :func:`unknown_field_paths` on every request.
"""

from __future__ import annotations

from google.protobuf import unknown_fields
from google.protobuf.message import Message

# A message that came as at most this many bytes is first checked in one pass in C (a copy without
# its unknown fields is as large as the message exactly when it has none): ~1 µs against ~6-9 µs
# for the walk in Python over a one-request DispatchMany message. A larger one (a big prompt, a
# full instance set) is walked directly: the pass copies the message and sizing it encodes it
# (≈ 1.7 ms for 10 MB), while the walk's cost grows with its fields, not its bytes.
FAST_CHECK_BYTES = 64 * 1024


def has_unknown_fields(msg: Message) -> bool:
    """Whether *msg* or any sub-message carries unknown fields (one pass in C; copies and sizes
    *msg*: for small messages)."""
    bare = type(msg)()
    bare.CopyFrom(msg)
    bare.DiscardUnknownFields()  # recursive into sub-messages
    return bare.ByteSize() != msg.ByteSize()


def unknown_field_paths(msg: Message, prefix: str = "", *, wire_size: int | None = None) -> list[str]:
    """Paths of unknown fields in *msg* and its set sub-messages, e.g. ``node.#111``. *wire_size*:
    the bytes *msg* was parsed from; at most :data:`FAST_CHECK_BYTES` of them, the one-pass check
    decides first."""
    if wire_size is not None and wire_size <= FAST_CHECK_BYTES and not has_unknown_fields(msg):
        return []  # the usual case, without the walk
    name = prefix or msg.DESCRIPTOR.name
    unknown = unknown_fields.UnknownFieldSet(msg)
    found = [f"{name}.#{unknown[i].field_number}" for i in range(len(unknown))]
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            values = value.values() if field.message_type.fields_by_name["value"].message_type else []
        elif field.is_repeated:
            values = value
        else:
            values = [value]
        for i, item in enumerate(values):
            if isinstance(item, Message):
                suffix = f"[{i}]" if field.is_repeated else ""
                found += unknown_field_paths(item, f"{name}.{field.name}{suffix}")
    return found
