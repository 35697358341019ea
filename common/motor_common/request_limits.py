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
- ``lease_seconds`` within (0, ``MAX_LEASE_SEC``].

A violation is an ``InvalidArgument`` (reason ``OUT_OF_RANGE`` or ``TOO_LONG``) naming the field
path, the value or size, and the allowed range, so the caller can fix the request; nothing is
applied. Handlers keep their own semantic checks (which endpoint ids exist, ...).
"""

from __future__ import annotations

import math
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from motor_common.errors import InvalidArgument

MAX_STRING = 4096
MAX_NAME = 256
MAX_BYTES = 64 * 1024 * 1024  # = the servers' max message size
MAX_REPEATED = 10_000
MAX_COUNT = 65_536
MAX_PID = 4_194_304  # Linux pid_max limit
MAX_PORT = 65_535
MAX_INSTANCE_ID = 2**53 - 1
MAX_LEASE_SEC = 3600.0
MAX_GENERATION = 2**63 - 1

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


def _check_scalar(fd: FieldDescriptor, full: str, path: str, value: Any) -> None:
    name = fd.name
    t = fd.type
    if t == FieldDescriptor.TYPE_STRING:
        limit = MAX_NAME if name in NAME_FIELDS else MAX_STRING
        if len(value) > limit:
            raise InvalidArgument(f"{path} is {len(value)} characters long; at most {limit} are allowed",
                                  reason="TOO_LONG", metadata={"field": path})
        return
    if t == FieldDescriptor.TYPE_BYTES:
        if len(value) > MAX_BYTES:
            raise InvalidArgument(f"{path} is {len(value)} bytes; at most {MAX_BYTES} are allowed",
                                  reason="TOO_LONG", metadata={"field": path})
        return
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        if not math.isfinite(value) or value < 0:
            raise InvalidArgument(f"{path} {value} must be a finite number >= 0", reason="OUT_OF_RANGE",
                                  metadata={"field": path})
        if name == "lease_seconds" and not 0 < value <= MAX_LEASE_SEC:
            raise _out_of_range(path, value, "more than 0", MAX_LEASE_SEC)
        return
    if t in (FieldDescriptor.TYPE_ENUM, FieldDescriptor.TYPE_BOOL):
        return
    # integers
    if name.endswith("port"):
        lo = 1 if full in REQUIRED_PORTS else 0
        if not lo <= value <= MAX_PORT:
            raise _out_of_range(path, value, lo, MAX_PORT)
    elif name in ("instance_id", "instance_ids") or full == "motor.common.v1.Instance.id":
        if not 1 <= value <= MAX_INSTANCE_ID:
            raise _out_of_range(path, value, 1, MAX_INSTANCE_ID)
    elif name in COUNT_FIELDS:
        if not 0 <= value <= MAX_COUNT:
            raise _out_of_range(path, value, 0, MAX_COUNT)
    elif name in ("pid", "pids"):
        if not 0 <= value <= MAX_PID:
            raise _out_of_range(path, value, 0, MAX_PID)
    elif name in ("generation", "sequence", "acked_sequence") and value > MAX_GENERATION:
        raise _out_of_range(path, value, 0, MAX_GENERATION)


def _required(msg: Any, path: str) -> None:
    desc = msg.DESCRIPTOR
    if desc.full_name in ID_REQUIRED and "instance_id" in desc.fields_by_name and msg.instance_id == 0:
        raise InvalidArgument(f"{path}instance_id is required: instance ids start at 1", reason="OUT_OF_RANGE",
                              metadata={"field": f"{path}instance_id"})
    if desc.full_name == "motor.common.v1.Instance" and msg.id == 0:
        raise InvalidArgument(f"{path}id is required: instance ids start at 1 (0 is not an instance id)",
                              reason="OUT_OF_RANGE", metadata={"field": f"{path}id"})


def check_request(msg: Any, prefix: str = "") -> None:
    """Raise ``InvalidArgument`` for the first field of *msg* (recursively) out of its bounds."""
    _required(msg, prefix)
    for fd, value in msg.ListFields():
        path = f"{prefix}{fd.name}"
        full = f"{msg.DESCRIPTOR.full_name}.{fd.name}"
        is_map = fd.message_type is not None and fd.message_type.GetOptions().map_entry
        if fd.is_repeated:
            if len(value) > MAX_REPEATED:
                raise InvalidArgument(f"{path} has {len(value)} items; at most {MAX_REPEATED} are allowed",
                                      reason="TOO_LONG", metadata={"field": path})
            if is_map:
                vfd = fd.message_type.fields_by_name["value"]
                for k, v in value.items():
                    if isinstance(k, str) and len(k) > MAX_NAME:
                        raise InvalidArgument(f"{path} has a key of {len(k)} characters; at most {MAX_NAME}",
                                              reason="TOO_LONG", metadata={"field": path})
                    if vfd.type == FieldDescriptor.TYPE_MESSAGE:
                        check_request(v, f"{path}[{k!r}].")
                    else:
                        _check_scalar(vfd, full, f"{path}[{k!r}]", v)
                continue
            for i, item in enumerate(value):
                if fd.type == FieldDescriptor.TYPE_MESSAGE:
                    check_request(item, f"{path}[{i}].")
                else:
                    _check_scalar(fd, full, f"{path}[{i}]", item)
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            if fd.message_type.full_name.startswith("google.protobuf."):
                continue
            check_request(value, f"{path}.")
        else:
            _check_scalar(fd, full, path, value)
