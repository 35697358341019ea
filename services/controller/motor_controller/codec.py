"""Store records ↔ domain objects (JSON via orjson). Keys live in :data:`KEYS`.

Decoding is lenient where that is safe: keys a record does not define are ignored at every level
(a record written by a newer version, which added a field, still loads), and fields an older
version did not write take their defaults. A record that still cannot be decoded (truncated,
corrupt, an enum value this version does not know) raises :class:`RecordError` from
:func:`decode`, which names the record's key; what to do with it is the loader's decision.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, fields
from typing import Any, TypeVar

import orjson

from motor_common.domain import (
    Capabilities,
    Endpoint,
    EngineType,
    Instance,
    InstanceStatus,
    NodeSpec,
    Role,
)
from motor_controller.alarms import Alarm, AlarmAction, AlarmKind
from motor_controller.model import InstanceState, ManagedInstance, NodeRecord

T = TypeVar("T")


class RecordError(ValueError):
    """A stored record that cannot be decoded; the message names its key and the cause."""

    def __init__(self, key: str, cause: BaseException) -> None:
        self.key = key
        super().__init__(f"store record {key!r} cannot be decoded: {type(cause).__name__}: {str(cause)[:200]}")


def decode(key: str, decoder: Callable[[bytes], T], raw: bytes) -> T:
    """``decoder(raw)``; any failure to decode (bad JSON, missing field, wrong type, unknown enum
    value) is a :class:`RecordError` naming *key*."""
    try:
        return decoder(raw)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RecordError(key, exc) from exc


# The layout of the records under KEYS, as a whole. Raised only by a change an older version would
# misread (a field that changes meaning, a record moved): additive fields do not need it, older
# versions ignore them. A store without the key is format 1 (written before the key existed).
STORE_FORMAT = 1


def store_format(raw: bytes | None) -> int:
    """The format *raw* (``meta/format``) names; :class:`RecordError` if it is not a positive integer."""
    if raw is None:
        return 1
    try:
        value = int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RecordError(KEYS.META_FORMAT, exc) from exc
    if value < 1:
        raise RecordError(KEYS.META_FORMAT, ValueError(f"format {value} is not a positive integer"))
    return value


def _known(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """The items of *d* that are fields of dataclass *cls* (newer versions may add others)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


class KEYS:
    NODE = "nodes/"
    INSTANCE = "instances/"
    JOB = "jobs/"
    COORDINATOR = "coordinators/"
    ALARM = "alarms/"
    META_EPOCH = "meta/epoch"
    META_FORMAT = "meta/format"
    SCALE_DOWN = "scaledown/"


def _endpoint(d: dict[str, Any]) -> Endpoint:
    return Endpoint(**_known(Endpoint, d))


def _instance(d: dict[str, Any]) -> Instance:
    return Instance(
        id=d["id"],
        role=Role(d["role"]),
        job_name=d["job_name"],
        model_name=d["model_name"],
        engine_type=EngineType(d["engine_type"]),
        endpoints=tuple(_endpoint(e) for e in d["endpoints"]),
        status=InstanceStatus(d.get("status", "available")),
    )


def _instance_dict(inst: Instance) -> dict[str, Any]:
    return {
        "id": inst.id,
        "role": inst.role.value,
        "job_name": inst.job_name,
        "model_name": inst.model_name,
        "engine_type": inst.engine_type.value,
        "endpoints": [asdict(e) for e in inst.endpoints],
        "status": inst.status.value,
    }


def encode_node(rec: NodeRecord) -> bytes:
    s = rec.spec
    return orjson.dumps(
        {
            "spec": {
                **{k: getattr(s, k) for k in ("node_id", "job_name", "ip", "admin_port", "model_name",
                                              "node_rank", "nodes_per_instance", "local_world_size")},
                "role": s.role.value,
                "engine_type": s.engine_type.value,
                "endpoints": [asdict(e) for e in s.endpoints],
                "capabilities": asdict(s.capabilities),
            },
            "registered_at": rec.registered_at,
        }
    )


def decode_node(raw: bytes) -> NodeRecord:
    d = orjson.loads(raw)
    s = d["spec"]
    spec = NodeSpec(
        node_id=s["node_id"],
        job_name=s["job_name"],
        role=Role(s["role"]),
        ip=s["ip"],
        admin_port=s["admin_port"],
        engine_type=EngineType(s["engine_type"]),
        model_name=s["model_name"],
        node_rank=s["node_rank"],
        nodes_per_instance=s["nodes_per_instance"],
        endpoints=tuple(_endpoint(e) for e in s["endpoints"]),
        capabilities=Capabilities(**_known(Capabilities, s["capabilities"])),
        local_world_size=s["local_world_size"],
    )
    return NodeRecord(spec=spec, registered_at=d["registered_at"], registered_mono=None)


def encode_instance(mi: ManagedInstance) -> bytes:
    return orjson.dumps(
        {
            "id": mi.id,
            "job_name": mi.job_name,
            "incarnation": mi.incarnation,
            "state": mi.state.value,
            "instance": None if mi.instance is None else _instance_dict(mi.instance),
            "node_ids": list(mi.node_ids),
            "master_address": mi.master_address,
            "state_changed_at": mi.state_changed_at,
            "reason": mi.reason,
            "generation": mi.generation,
            "withdrawn_dp_ranks": list(mi.withdrawn_dp_ranks),
            "paused": mi.paused,
            "pause_reason": mi.pause_reason,
            "paused_at": mi.paused_at,
            "routable_until": mi.routable_until,
        }
    )


def decode_instance(raw: bytes) -> ManagedInstance:
    d = orjson.loads(raw)
    return ManagedInstance(
        id=d["id"],
        job_name=d["job_name"],
        incarnation=d["incarnation"],
        state=InstanceState(d["state"]),
        instance=None if d["instance"] is None else _instance(d["instance"]),
        node_ids=tuple(d["node_ids"]),
        master_address=d["master_address"],
        state_changed_at=d["state_changed_at"],
        reason=d["reason"],
        generation=d["generation"],
        withdrawn_dp_ranks=tuple(d.get("withdrawn_dp_ranks", ())),
        # records written before operator pauses existed carry none
        paused=bool(d.get("paused", False)),
        pause_reason=str(d.get("pause_reason", "")),
        paused_at=float(d.get("paused_at", 0.0)),
        # records written before node_lost_routing_grace_sec existed: not kept in routing
        routable_until=float(d.get("routable_until", 0.0)),
    )


def encode_alarm(a: Alarm) -> bytes:
    return orjson.dumps({**asdict(a), "kind": a.kind.value, "action": a.action.value})


def decode_alarm(raw: bytes) -> Alarm:
    d = orjson.loads(raw)
    return Alarm(
        kind=AlarmKind(d["kind"]),
        action=AlarmAction(d["action"]),
        source=d["source"],
        instance_ids=tuple(d["instance_ids"]),
        address=d["address"],
        message=d["message"],
        raised_at=d["raised_at"],
    )


def alarm_store_key(a: Alarm) -> str:
    kind, source, ids = a.key
    return f"{KEYS.ALARM}{kind}/{source}/{','.join(map(str, ids))}"
