"""Node registration rules (pure): strict NodeSpec validation and the re-register decision.

Errors raised here are ``motor_common.errors`` caller errors (INVALID_ARGUMENT, ALREADY_EXISTS).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import replace

from motor_common.domain import MAX_PORT, MIN_BUSINESS_PORT, NodeSpec, is_ip, normalize_ip
from motor_common.errors import AlreadyExists, InvalidArgument
from motor_controller.model import NodeRecord

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@\-]{0,252}$")


def _bad(message: str) -> InvalidArgument:
    return InvalidArgument(f"invalid node spec: {message}", reason="INVALID_NODE_SPEC")


def validate_spec(spec: NodeSpec) -> NodeSpec:
    """Return *spec* with endpoint ip/node_id filled in, or raise InvalidArgument."""
    if not spec.node_id:
        raise _bad("node_id is required")
    if not _NAME.match(spec.node_id):
        raise _bad(f"node_id {spec.node_id!r} must be 1-253 chars of [A-Za-z0-9._:@-]")
    if not spec.job_name:
        raise _bad("job_name is required")
    if not _NAME.match(spec.job_name):
        raise _bad(f"job_name {spec.job_name!r} must be 1-253 chars of [A-Za-z0-9._:@-]")
    if not spec.ip or not is_ip(spec.ip):
        raise _bad(f"ip {spec.ip!r} is not an IPv4 or IPv6 address")
    if not 1 <= spec.admin_port <= MAX_PORT:
        raise _bad(f"admin_port {spec.admin_port} is outside [1, {MAX_PORT}]")
    if not spec.model_name:
        raise _bad("model_name is required")
    if spec.nodes_per_instance < 1:
        raise _bad("nodes_per_instance must be >= 1")
    if spec.node_rank >= spec.nodes_per_instance:
        raise _bad(f"node_rank {spec.node_rank} must be < nodes_per_instance {spec.nodes_per_instance}")
    if not spec.endpoints:
        raise _bad("at least one endpoint is required")
    ip = normalize_ip(spec.ip)
    ids: set[int] = set()
    ranks: set[int] = set()
    ports: set[int] = set()
    fixed = []
    for i, ep in enumerate(spec.endpoints):
        where = f"endpoints[{i}]"
        if ep.ip and normalize_ip(ep.ip) != ip:
            raise _bad(f"{where}.ip {ep.ip!r} differs from the node ip {spec.ip!r}")
        if not MIN_BUSINESS_PORT <= ep.business_port <= MAX_PORT:
            raise _bad(f"{where}.business_port {ep.business_port} is outside [{MIN_BUSINESS_PORT}, {MAX_PORT}]")
        for name in ("bootstrap_port", "kv_port", "kv_events_port", "kv_events_replay_port"):
            port = getattr(ep, name)
            if port and not MIN_BUSINESS_PORT <= port <= MAX_PORT:
                raise _bad(f"{where}.{name} {port} must be 0 or in [{MIN_BUSINESS_PORT}, {MAX_PORT}]")
        for port in (ep.business_port, ep.bootstrap_port, ep.kv_port, ep.kv_events_port, ep.kv_events_replay_port):
            if port and port in ports:
                raise _bad(f"{where}: port {port} is used twice on this node")
            if port:
                ports.add(port)
        if ep.id in ids:
            raise _bad(f"{where}.id {ep.id} is duplicated")
        if ep.dp_rank in ranks:
            raise _bad(f"{where}.dp_rank {ep.dp_rank} is duplicated")
        if ep.node_id and ep.node_id != spec.node_id:
            raise _bad(f"{where}.node_id {ep.node_id!r} differs from node_id {spec.node_id!r}")
        ids.add(ep.id)
        ranks.add(ep.dp_rank)
        fixed.append(replace(ep, ip=ep.ip or spec.ip, node_id=spec.node_id))
    if ranks != set(range(len(spec.endpoints))):
        raise _bad(f"local dp_rank values must be 0..{len(spec.endpoints) - 1}, got {sorted(ranks)}")
    return replace(spec, endpoints=tuple(fixed))


class Registration(enum.Enum):
    NEW = "new"
    IDEMPOTENT = "idempotent"  # identical spec re-registered (e.g. after a heartbeat REREGISTER)
    UPDATE = "update"  # same identity, other details (ports after a restart): replaces the spec
    REPLACE = "replace"  # the old record was lost: replaced, even with another identity


def decide_registration(
    spec: NodeSpec,
    existing: NodeRecord | None,
    others: Iterable[NodeRecord],
    is_alive: dict[str, bool],
) -> tuple[Registration, list[str]]:
    """Decide how to register *spec*; returns the decision and node ids it displaces.

    *others* are the records of the same job; a live node holding the same rank under another
    node id is a conflict (ALREADY_EXISTS), a lost one is displaced.
    """
    displaced: list[str] = []
    for other in others:
        o = other.spec
        if o.node_id == spec.node_id or o.job_name != spec.job_name or o.node_rank != spec.node_rank:
            continue
        if is_alive.get(o.node_id, False):
            raise AlreadyExists(
                f"rank {spec.node_rank} of job {spec.job_name!r} is held by live node {o.node_id!r}",
                reason="NODE_RANK_TAKEN",
                metadata={"node_id": o.node_id},
            )
        displaced.append(o.node_id)
    if existing is None:
        return Registration.NEW, displaced
    if existing.spec == spec:
        return Registration.IDEMPOTENT, displaced
    alive = is_alive.get(spec.node_id, False)
    if existing.spec.identity() != spec.identity():
        if alive:
            old = existing.spec
            raise AlreadyExists(
                f"node {spec.node_id!r} is registered and alive with another identity "
                f"(job={old.job_name!r}, role={old.role.value}, rank={old.node_rank}, ip={old.ip})",
                reason="NODE_ID_CONFLICT",
                metadata={"node_id": spec.node_id},
            )
        return Registration.REPLACE, displaced
    return (Registration.UPDATE if alive else Registration.REPLACE), displaced
