"""Standalone registration logic, no I/O: endpoint parsing, instance ids, conflicts, deletes.

Errors (all :class:`motor_common.errors.MotorError`, so the CLI prints one line and exits 1)::

    InvalidArgument     a malformed --endpoint / role / engine / registration file
    AlreadyExists       an endpoint or id is already registered under another identity
    NotFound            ``del`` of an id or endpoint that is not registered
    FailedPrecondition  ``set`` would drop instances the controller manages (without --force)

Instance ids live in the namespace ``STANDALONE_ID_BIT`` (bit 52) that controller-assigned ids
never use: ``id = STANDALONE_ID_BIT | blake2b(role, sorted endpoint group) & (2**52 - 1)``, so
every id is at most 2^53 - 1 and exact as a JSON/JavaScript number. The
endpoint group is sorted before hashing and endpoint ids are assigned in that sorted order, so
the order in which an operator lists endpoints changes neither the instance id, nor the default
job name, nor any endpoint id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from motor_common.domain import (
    INSTANCE_HASH_MASK,
    MAX_PORT,
    MIN_BUSINESS_PORT,
    STANDALONE_ID_BIT,
    Endpoint,
    EngineType,
    Instance,
    Role,
    is_ip,
    normalize_ip,
)
from motor_common.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound

_HASH_MASK = INSTANCE_HASH_MASK  # the 52 bits below the namespace bit


@dataclass(frozen=True, order=True)
class EndpointSpec:
    """One engine as the operator names it:
    ``IP:PORT[,bootstrap=N][,kv=N][,kv_events=N][,kv_events_replay=N]`` (the last two: the
    engine's KV-event publisher and replay ports, docs/kv-events.md)."""

    ip: str
    port: int
    bootstrap_port: int = 0
    kv_port: int = 0
    kv_events_port: int = 0
    kv_events_replay_port: int = 0

    @property
    def host_port(self) -> str:
        return f"[{self.ip}]:{self.port}" if ":" in self.ip else f"{self.ip}:{self.port}"

    def canonical(self) -> str:
        text = f"{self.host_port},bootstrap={self.bootstrap_port},kv={self.kv_port}"
        if self.kv_events_port or self.kv_events_replay_port:  # ids of endpoints without stay as they were
            text += f",kv_events={self.kv_events_port},kv_events_replay={self.kv_events_replay_port}"
        return text


def _port(text: str, what: str, minimum: int = 1) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(f"{what}: {text!r} is not a port number", reason="INVALID_ENDPOINT") from None
    if not minimum <= value <= MAX_PORT:
        raise InvalidArgument(f"{what}: {value} is outside [{minimum}, {MAX_PORT}]", reason="INVALID_ENDPOINT")
    return value


def parse_endpoint(text: str) -> EndpointSpec:
    """Parse ``IP:PORT[,bootstrap=N][,kv=N][,kv_events=N][,kv_events_replay=N]`` (IPv6 as ``[::1]:8000``)."""
    head, *options = [part.strip() for part in text.strip().split(",")]
    where = f"endpoint {text!r}"
    if head.startswith("["):
        ip, sep, rest = head[1:].partition("]:")
        port_text = rest if sep else ""
    else:
        ip, sep, port_text = head.rpartition(":")
    if not ip or not port_text:
        raise InvalidArgument(f"{where}: expected IP:PORT[,bootstrap=N][,kv=N][,kv_events=N][,kv_events_replay=N]",
                              reason="INVALID_ENDPOINT")
    if not is_ip(ip):
        raise InvalidArgument(f"{where}: {ip!r} is not an IPv4 or IPv6 address", reason="INVALID_ENDPOINT")
    port = _port(port_text, where, MIN_BUSINESS_PORT)
    extra = {"bootstrap": 0, "kv": 0, "kv_events": 0, "kv_events_replay": 0}
    given: set[str] = set()
    for option in options:
        key, eq, value = option.partition("=")
        if not eq or key not in extra:
            raise InvalidArgument(
                f"{where}: unknown option {option!r} (known: bootstrap=N, kv=N, kv_events=N, kv_events_replay=N)",
                reason="INVALID_ENDPOINT",
            )
        if key in given:  # the last one won silently
            raise InvalidArgument(f"{where}: option {key} is given twice", reason="INVALID_ENDPOINT")
        given.add(key)
        extra[key] = _port(value, f"{where} {key}")
    return EndpointSpec(normalize_ip(ip), port, extra["bootstrap"], extra["kv"], extra["kv_events"],
                        extra["kv_events_replay"])


def sorted_group(endpoints: Iterable[EndpointSpec]) -> tuple[EndpointSpec, ...]:
    group = tuple(sorted(set(endpoints), key=lambda e: (e.ip, e.port, e.bootstrap_port, e.kv_port)))
    seen: dict[tuple[str, int], EndpointSpec] = {}
    for ep in group:
        if (ep.ip, ep.port) in seen:
            raise InvalidArgument(
                f"endpoint {ep.host_port} is listed twice with different options", reason="DUPLICATE_ENDPOINT"
            )
        seen[(ep.ip, ep.port)] = ep
    return group


def derive_instance_id(role: Role, endpoints: Iterable[EndpointSpec]) -> int:
    """A stable id with bit 52 set (at most 2^53 - 1), from *role* and the sorted full endpoint group."""
    group = sorted_group(endpoints)
    if not group:
        raise InvalidArgument("an instance needs at least one endpoint", reason="NO_ENDPOINTS")
    text = role.value + "|" + ";".join(ep.canonical() for ep in group)
    digest = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
    return STANDALONE_ID_BIT | (digest & _HASH_MASK)


def default_job_name(role: Role, instance_id: int) -> str:
    return f"standalone-{role.value}-{instance_id & _HASH_MASK:013x}"


def build_instance(
    role: Role, model: str, engine: EngineType, endpoints: Sequence[EndpointSpec], job: str | None = None
) -> Instance:
    """The Instance to register; endpoint ids (and DP ranks) follow the sorted endpoint order."""
    if not model:
        raise InvalidArgument("--model must be a non-empty model name", reason="INVALID_MODEL")
    group = sorted_group(endpoints)
    iid = derive_instance_id(role, group)
    eps = tuple(
        Endpoint(id=i, ip=ep.ip, business_port=ep.port, bootstrap_port=ep.bootstrap_port,
                 kv_port=ep.kv_port, dp_rank=i, kv_events_port=ep.kv_events_port,
                 kv_events_replay_port=ep.kv_events_replay_port)
        for i, ep in enumerate(group)
    )
    return Instance(id=iid, role=role, job_name=job or default_job_name(role, iid), model_name=model,
                    engine_type=engine, endpoints=eps)


def _addr(ep: Endpoint) -> tuple[str, int]:
    return (normalize_ip(ep.ip), ep.business_port)


def _show(addr: tuple[str, int]) -> str:
    return f"[{addr[0]}]:{addr[1]}" if ":" in addr[0] else f"{addr[0]}:{addr[1]}"


def check_batch(new: Sequence[Instance]) -> None:
    """No id and no endpoint twice inside one submission."""
    ids: dict[int, Instance] = {}
    owners: dict[tuple[str, int], Instance] = {}
    for inst in new:
        if inst.id in ids:
            raise InvalidArgument(f"instance {inst.id} is listed twice", reason="DUPLICATE_INSTANCE")
        ids[inst.id] = inst
        for ep in inst.endpoints:
            other = owners.setdefault(_addr(ep), inst)
            if other is not inst:
                raise InvalidArgument(
                    f"endpoint {_show(_addr(ep))} is listed in two instances", reason="DUPLICATE_ENDPOINT"
                )


def same_registration(a: Instance, b: Instance) -> bool:
    return a.same_identity(b) and a.model_name == b.model_name and a.engine_type == b.engine_type


def plan_add(new: Sequence[Instance], existing: Sequence[Instance]) -> tuple[list[Instance], list[Instance]]:
    """Split *new* into (to submit, already registered identically); raise on any conflict."""
    check_batch(new)
    by_id = {inst.id: inst for inst in existing}
    by_addr = {_addr(ep): inst for inst in existing for ep in inst.endpoints}
    submit: list[Instance] = []
    present: list[Instance] = []
    for inst in new:
        old = by_id.get(inst.id)
        if old is not None:
            if same_registration(old, inst):
                present.append(inst)
                continue
            raise AlreadyExists(
                f"instance {inst.id} is already registered as {describe(old)}; delete it first",
                reason="INSTANCE_CONFLICT",
            )
        for ep in inst.endpoints:
            owner = by_addr.get(_addr(ep))
            if owner is not None:
                raise AlreadyExists(
                    f"endpoint {_show(_addr(ep))} is already registered in instance {owner.id} "
                    f"({describe(owner)}); delete that instance first",
                    reason="ENDPOINT_CONFLICT",
                )
        submit.append(inst)
    return submit, present


def plan_set(new: Sequence[Instance], existing: Sequence[Instance], *, force: bool = False) -> list[Instance]:
    """Instances a SET would drop; refuses to drop controller-managed ones unless *force*."""
    check_batch(new)
    keep = {inst.id for inst in new}
    dropped = [inst for inst in existing if inst.id not in keep]
    managed = [inst for inst in dropped if not inst.id & STANDALONE_ID_BIT]
    if managed and not force:
        ids = ", ".join(str(inst.id) for inst in managed)
        raise FailedPrecondition(
            f"set would remove {len(managed)} controller-managed instance(s) ({ids}); pass --force to replace them",
            reason="MANAGED_INSTANCES",
        )
    return dropped


def resolve_delete(
    existing: Sequence[Instance], *, ids: Sequence[int] = (), endpoints: Sequence[EndpointSpec] = ()
) -> list[Instance]:
    """The registered instances (full identities) named by id or by one of their endpoints."""
    by_id = {inst.id: inst for inst in existing}
    by_addr = {_addr(ep): inst for inst in existing for ep in inst.endpoints}
    out: dict[int, Instance] = {}
    for iid in ids:
        if iid not in by_id:
            raise NotFound(f"instance {iid} is not registered; nothing deleted", reason="INSTANCE_NOT_FOUND")
        out[iid] = by_id[iid]
    for spec in endpoints:
        owner = by_addr.get((spec.ip, spec.port))
        if owner is None:
            raise NotFound(
                f"no registered instance serves endpoint {spec.host_port}; nothing deleted",
                reason="ENDPOINT_NOT_FOUND",
            )
        out[owner.id] = owner
    if not out:
        raise InvalidArgument("del needs --id or --endpoint", reason="NOTHING_TO_DELETE")
    return list(out.values())


def describe(inst: Instance) -> str:
    eps = ",".join(e.host_port for e in inst.endpoints)
    return f"{inst.role.value} {inst.model_name!r} job {inst.job_name!r} at {eps}"
