"""Hypothesis strategies for any protobuf request message, built from its descriptor (bounded).

Half the messages stay inside the servers' bounds (they reach the handlers); in the others every
field may be absent or set; integers lean to the edges of their type and of the ranges the
servers enforce (0, 1, 65535, 65536, 2^53, max), strings and bytes are short mostly and sometimes
just over the servers' limits, doubles include NaN and infinities, enums include unknown numbers,
nested messages stop at ``MAX_DEPTH``, repeated fields hold at most ``MAX_ITEMS`` items.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import strategies as st

MAX_DEPTH = 3
MAX_ITEMS = 4

_INT_EDGES = {
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
}
_INTERESTING = (0, 1, 2, 255, 65535, 65536, 2**31 - 1, 2**32 - 1, 2**53 - 1, 2**53, 2**63 - 1, -1)


def _int(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = [v for v in _INTERESTING if lo <= v <= hi] + [lo, hi]
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


def _text() -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=24),
        st.sampled_from(["127.0.0.1", "::1", "tiny", "x" * 257, "y" * 4097, "../etc/passwd", "\x00", "é" * 300]),
    )


def _plausible(fd: FieldDescriptor) -> st.SearchStrategy[Any]:
    """Values inside the servers' bounds (so the request reaches the handler)."""
    t = fd.type
    if t in _INT_EDGES:
        lo, hi = _INT_EDGES[t]
        return st.one_of(st.integers(max(lo, 0), min(hi, 70_000)),
                         st.sampled_from([v for v in (1, 2**31 - 1, 2**40 + 1, 2**53 - 1) if v <= hi]))
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(0, 4000, allow_nan=False)
    if t == FieldDescriptor.TYPE_STRING:
        return st.one_of(st.text(max_size=12), st.sampled_from(["127.0.0.1", "tiny", "job-a", "vm:fuzz:0"]))
    if t == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in fd.enum_type.values])
    return _scalar(fd, plausible=False)


def _scalar(fd: FieldDescriptor, plausible: bool = False) -> st.SearchStrategy[Any]:
    if plausible:
        return _plausible(fd)
    t = fd.type
    if t in _INT_EDGES:
        return _int(*_INT_EDGES[t])
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.one_of(st.sampled_from([0.0, -1.0, 1e-9, 1e9, float("nan"), float("inf"), -float("inf")]),
                         st.floats(allow_nan=True, allow_infinity=True, width=32 if t == FieldDescriptor.TYPE_FLOAT else 64))
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_STRING:
        return _text()
    if t == FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), st.sampled_from([b"{}", b'{"model":"tiny","prompt":"x"}', b"\xff" * 3]))
    if t == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in fd.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-5, 1000))
    raise TypeError(f"unsupported field type {t} of {fd.full_name}")


def _value(fd: FieldDescriptor, depth: int, plausible: bool) -> st.SearchStrategy[Any] | None:
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        if fd.message_type.full_name.startswith("google.protobuf."):
            return None  # well-known types (timestamps) are set by servers, not fuzzed here
        if depth >= MAX_DEPTH:
            return None
        return message_dicts(fd.message_type, depth + 1, plausible)
    return _scalar(fd, plausible)


def message_dicts(desc: Descriptor, depth: int = 0, plausible: bool = False) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts of field name → value (nested messages as dicts) for *desc*."""
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for fd in desc.fields:
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            vfd = fd.message_type.fields_by_name["value"]
            val = _value(vfd, depth, plausible)
            if val is not None:
                optional[fd.name] = st.dictionaries(_text(), val, max_size=MAX_ITEMS)
            continue
        val = _value(fd, depth, plausible)
        if val is None:
            continue
        optional[fd.name] = st.lists(val, max_size=MAX_ITEMS) if fd.is_repeated else val
    return st.fixed_dictionaries({}, optional=optional)


def _fill(msg: Any, data: dict[str, Any]) -> None:
    desc = msg.DESCRIPTOR
    for name, value in data.items():
        fd = desc.fields_by_name[name]
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            target = getattr(msg, name)
            vfd = fd.message_type.fields_by_name["value"]
            for k, v in value.items():
                if vfd.type == FieldDescriptor.TYPE_MESSAGE:
                    _fill(target[k], v)
                else:
                    target[k] = v
        elif fd.is_repeated:
            field = getattr(msg, name)
            for item in value:
                if fd.type == FieldDescriptor.TYPE_MESSAGE:
                    _fill(field.add(), item)
                else:
                    field.append(item)
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            _fill(getattr(msg, name), value)
            getattr(msg, name).SetInParent()
        elif fd.containing_oneof is not None or value is not None:
            setattr(msg, name, value)


def requests(desc: Descriptor) -> st.SearchStrategy[Any]:
    """Messages of type *desc* (any field set or not, bounded sizes and depth): half hostile
    (edge values, too long, NaN, unknown enums), half plausible (inside the servers' bounds, so
    they reach the handlers and their semantic checks)."""
    cls = message_factory.GetMessageClass(desc)

    def build(data: dict[str, Any]) -> Any:
        msg = cls()
        _fill(msg, data)
        return msg

    return st.one_of(message_dicts(desc, plausible=True), message_dicts(desc)).map(build)
