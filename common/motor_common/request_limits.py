"""Bounds on every gRPC request, checked by the chassis before a handler runs (pure, no I/O).

Generic rules from the message descriptors, applied to every field of every request message
(nested messages included):

- strings at most ``MAX_STRING`` characters (``request_id`` and names: ``MAX_NAME``), bytes at
  most ``MAX_BYTES`` (the dispatch body; the HTTP fronts bound it much lower); repeated fields at most ``MAX_REPEATED`` items;
- doubles finite and >= 0; ports (fields named ``*port``) at most 65535, a set node admin port
  or business port at least 1; counts, ranks and sizes at most ``MAX_COUNT``; pids at most
  ``MAX_PID``;
- instance ids 1 .. 2^53 - 1 wherever an id names an instance (``Instance.id``, every
  ``instance_ids`` item, the ``instance_id`` of the requests in ``ID_REQUIRED``);
- generations 0 .. 2^53 - 1 (like instance ids, exact in every language's default number type and
  in JSON; the coordinator's registry never goes higher), heartbeat sequences 0 .. 2^63 - 1;
- ``lease_seconds`` within (0, ``MAX_LEASE_SEC``];
- timestamps (``google.protobuf.Timestamp``) within the type's range (years 1-9999, nanos
  0 .. 999,999,999), so converting them cannot fail.

A violation is an ``InvalidArgument`` (reason ``OUT_OF_RANGE`` or ``TOO_LONG``) naming the field
path, the value or size, and the allowed range, so the caller can fix the request; nothing is
applied. Handlers keep their own semantic checks (which endpoint ids exist, ...).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from motor_common.errors import InvalidArgument

MAX_STRING = 4096
MAX_NAME = 256
MAX_BYTES = 64 * 1024 * 1024  # = the coordinator's max message size (Dispatch bodies)
MAX_REPEATED = 10_000
MAX_COUNT = 65_536
MAX_PID = 4_194_304  # Linux pid_max limit
MAX_PORT = 65_535
MAX_INSTANCE_ID = 2**53 - 1
MAX_LEASE_SEC = 3600.0
MAX_GENERATION = 2**53 - 1
MAX_SEQUENCE = 2**63 - 1
# google.protobuf.Timestamp's range: 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z.
MIN_TIMESTAMP_SEC = -62_135_596_800
MAX_TIMESTAMP_SEC = 253_402_300_799

NAME_FIELDS = {"request_id", "job_name", "model_name", "node_id", "name", "reason_code", "election_key"}
COUNT_FIELDS = {"node_rank", "nodes_per_instance", "local_world_size", "num_nodes", "dp_size", "dp_rank",
                "dead_dp_ranks", "retired_dp_ranks", "page_size", "relaunch_count", "relaunch_attempts",
                "endpoint_id", "device_count"}
# Ports that must be set (>= 1); other *port fields may be 0 (= unused).
REQUIRED_PORTS = {"motor.common.v1.Endpoint.business_port", "motor.controller.v1.NodeSpec.admin_port"}
# Requests whose instance_id names an existing instance (0 is not an instance).
ID_REQUIRED = {
    "motor.coordinator.v1.GetInstanceRequest", "motor.controller.v1.GetInstanceRequest",
    "motor.controller.v1.TerminateInstanceRequest", "motor.controller.v1.GetFaultToleranceStatusRequest",
    "motor.nodemanager.v1.StartEnginesRequest", "motor.nodemanager.v1.GuardScaleDownRequest",
    "motor.nodemanager.v1.ApplyScaleDownRequest", "motor.nodemanager.v1.FinalizeScaleDownRequest",
}


def _out_of_range(path: str, value: Any, lo: Any, hi: Any) -> InvalidArgument:
    return InvalidArgument(f"{path} {value} is outside [{lo}, {hi}]", reason="OUT_OF_RANGE",
                           metadata={"field": path})


# A scalar check returns None when the value is fine, else a function of the field path that
# makes the error (so no string is built on the happy path).
Check = Callable[[Any], Callable[[str], InvalidArgument] | None]


def _too_long(limit: int, unit: str) -> Check:
    def check(value: Any) -> Callable[[str], InvalidArgument] | None:
        if len(value) <= limit:
            return None
        n = len(value)
        return lambda path: InvalidArgument(f"{path} is {n} {unit} long; at most {limit} are allowed",
                                            reason="TOO_LONG", metadata={"field": path})
    return check


def _range(lo: int | float, hi: int | float, shown_lo: Any = None) -> Check:
    def check(value: Any) -> Callable[[str], InvalidArgument] | None:
        if lo <= value <= hi:
            return None
        return lambda path: _out_of_range(path, value, lo if shown_lo is None else shown_lo, hi)
    return check


def _double(name: str) -> Check:
    def check(value: Any) -> Callable[[str], InvalidArgument] | None:
        if not math.isfinite(value) or value < 0:
            return lambda path: InvalidArgument(f"{path} {value} must be a finite number >= 0",
                                                reason="OUT_OF_RANGE", metadata={"field": path})
        if name == "lease_seconds" and not 0 < value <= MAX_LEASE_SEC:
            return lambda path: _out_of_range(path, value, "more than 0", MAX_LEASE_SEC)
        return None
    return check


def _timestamp(value: Any) -> Callable[[str], InvalidArgument] | None:
    """A ``google.protobuf.Timestamp`` within the type's own range (what its conversions accept)."""
    if MIN_TIMESTAMP_SEC <= value.seconds <= MAX_TIMESTAMP_SEC and 0 <= value.nanos <= 999_999_999:
        return None
    seconds, nanos = value.seconds, value.nanos
    return lambda path: InvalidArgument(
        f"{path} {{seconds: {seconds}, nanos: {nanos}}} is not a valid timestamp: seconds must be in "
        f"[{MIN_TIMESTAMP_SEC}, {MAX_TIMESTAMP_SEC}] (years 1-9999) and nanos in [0, 999999999]",
        reason="OUT_OF_RANGE", metadata={"field": path})


def _scalar_check(fd: FieldDescriptor, full: str) -> Check | None:
    name, t = fd.name, fd.type
    if t == FieldDescriptor.TYPE_STRING:
        return _too_long(MAX_NAME if name in NAME_FIELDS else MAX_STRING, "characters")
    if t == FieldDescriptor.TYPE_BYTES:
        return _too_long(MAX_BYTES, "bytes")
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return _double(name)
    if t in (FieldDescriptor.TYPE_ENUM, FieldDescriptor.TYPE_BOOL):
        return None
    if name.endswith("port"):
        return _range(1 if full in REQUIRED_PORTS else 0, MAX_PORT)
    if name in ("instance_id", "instance_ids") or full == "motor.common.v1.Instance.id":
        return _range(1, MAX_INSTANCE_ID)
    if name in COUNT_FIELDS:
        return _range(0, MAX_COUNT)
    if name in ("pid", "pids"):
        return _range(0, MAX_PID)
    if name in ("generation", "if_generation"):
        return _range(0, MAX_GENERATION)
    if name in ("sequence", "acked_sequence"):
        return _range(0, MAX_SEQUENCE)
    return None


@dataclass(frozen=True, slots=True)
class _Rule:
    repeated: bool
    message: bool  # a nested message (or map of messages): checked recursively
    is_map: bool
    check: Check | None  # scalars, map values


_PLANS: dict[str, dict[str, _Rule | None]] = {}


def _plan(desc: Any) -> dict[str, _Rule | None]:
    """Per message type, once: how each field is checked (None = not at all)."""
    plan = _PLANS.get(desc.full_name)
    if plan is not None:
        return plan
    plan = {}
    for fd in desc.fields:
        full = f"{desc.full_name}.{fd.name}"
        mt = fd.message_type
        if mt is not None and mt.GetOptions().map_entry:
            vfd = mt.fields_by_name["value"]
            plan[fd.name] = _Rule(True, vfd.type == FieldDescriptor.TYPE_MESSAGE, True, _scalar_check(vfd, full))
        elif mt is not None and mt.full_name == "google.protobuf.Timestamp":
            plan[fd.name] = _Rule(fd.is_repeated, False, False, _timestamp)
        elif mt is not None:
            plan[fd.name] = None if mt.full_name.startswith("google.protobuf.") else _Rule(fd.is_repeated, True, False, None)
        else:
            plan[fd.name] = _Rule(fd.is_repeated, False, False, _scalar_check(fd, full))
    _PLANS[desc.full_name] = plan
    return plan


def _required(msg: Any, path: str) -> None:
    desc = msg.DESCRIPTOR
    if desc.full_name in ID_REQUIRED and msg.instance_id == 0:
        raise InvalidArgument(f"{path}instance_id is required: instance ids start at 1", reason="OUT_OF_RANGE",
                              metadata={"field": f"{path}instance_id"})
    if desc.full_name == "motor.common.v1.Instance" and msg.id == 0:
        raise InvalidArgument(f"{path}id is required: instance ids start at 1 (0 is not an instance id)",
                              reason="OUT_OF_RANGE", metadata={"field": f"{path}id"})


def check_request(msg: Any, prefix: str = "") -> None:
    """Raise ``InvalidArgument`` for the first field of *msg* (recursively) out of its bounds."""
    _required(msg, prefix)
    plan = _plan(msg.DESCRIPTOR)
    for fd, value in msg.ListFields():
        rule = plan.get(fd.name)
        if rule is None:
            continue
        if rule.repeated:
            if len(value) > MAX_REPEATED:
                path = f"{prefix}{fd.name}"
                raise InvalidArgument(f"{path} has {len(value)} items; at most {MAX_REPEATED} are allowed",
                                      reason="TOO_LONG", metadata={"field": path})
            if rule.is_map:
                for k, v in value.items():
                    if isinstance(k, str) and len(k) > MAX_NAME:
                        path = f"{prefix}{fd.name}"
                        raise InvalidArgument(f"{path} has a key of {len(k)} characters; at most {MAX_NAME}",
                                              reason="TOO_LONG", metadata={"field": path})
                    if rule.message:
                        check_request(v, f"{prefix}{fd.name}[{k!r}].")
                    elif rule.check is not None and (bad := rule.check(v)) is not None:
                        raise bad(f"{prefix}{fd.name}[{k!r}]")
            elif rule.message:
                for i, item in enumerate(value):
                    check_request(item, f"{prefix}{fd.name}[{i}].")
            elif rule.check is not None:
                for i, item in enumerate(value):
                    if (bad := rule.check(item)) is not None:
                        raise bad(f"{prefix}{fd.name}[{i}]")
        elif rule.message:
            check_request(value, f"{prefix}{fd.name}.")
        elif rule.check is not None and (bad := rule.check(value)) is not None:
            raise bad(f"{prefix}{fd.name}")


# A request larger than this is measured on the wire (count_fields) before it is parsed: a smaller
# one holds at most ~8 000 fields, which parse and check in milliseconds.
MEASURE_ABOVE_BYTES = 16 * 1024
# Fields (nested messages' fields and map entries included) a request may hold, unless its service
# allows more (the coordinator's registry: a full instance set is ~27 fields per instance).
# Counting costs ~2 µs a field (so at most ~0.1 s); a gateway's DispatchMany batch holds ~3 000.
MAX_FIELDS = 50_000
_STRINGY = (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES)


def _varint(raw: bytes, pos: int, end: int) -> tuple[int, int]:
    """(value, next position); position -1 when the varint is cut off or too long."""
    value = shift = 0
    while pos < end and shift < 64:
        b = raw[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
    return 0, -1


def count_fields(raw: bytes, desc: Any, budget: int) -> int:
    """How many fields the serialized *desc* message *raw* holds, nested messages' fields included,
    counted on the wire before anything parses it (parsing 60 MiB of nested empty messages builds
    30 million objects: seconds and gigabytes). Stops as soon as the count passes *budget*. A
    packed repeated number counts one per byte (at most that many items). Bytes that are not valid
    wire format end the count early: the parser then refuses them."""
    count = 0
    stack = [(0, len(raw), desc)]
    while stack:
        pos, end, msg = stack.pop()
        by_number = msg.fields_by_number
        while pos < end:
            tag, pos = _varint(raw, pos, end)
            count += 1
            if pos < 0 or count > budget:
                return count
            wire = tag & 7
            if wire == 0:
                _, pos = _varint(raw, pos, end)
                if pos < 0:
                    return count
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            elif wire == 2:
                size, pos = _varint(raw, pos, end)
                if pos < 0 or pos + size > end:
                    return count
                fd = by_number.get(tag >> 3)
                if fd is not None and fd.message_type is not None:
                    stack.append((pos, pos + size, fd.message_type))
                elif fd is not None and fd.type not in _STRINGY:
                    count += size  # packed numbers
                pos += size
            else:
                return count  # groups (no proto3 message has one; kept unparsed as unknown bytes)
    return count
