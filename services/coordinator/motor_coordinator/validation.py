"""Semantic validation of instances (pure). Every problem is an ``InvalidArgument``."""

from __future__ import annotations

from collections.abc import Sequence

from motor_common.domain import (
    MAX_PORT,
    MIN_BUSINESS_PORT,
    EngineType,
    Instance,
    Role,
    is_ip,
    normalize_ip,
)
from motor_common.errors import InvalidArgument


def validate_instance(inst: Instance, where: str) -> None:
    """Raise ``InvalidArgument`` naming *where* (e.g. ``instances[2]``) for the first problem."""
    if not inst.job_name.strip():
        raise InvalidArgument(f"{where}.job_name must not be empty", reason="INVALID_INSTANCE")
    if not inst.model_name.strip():
        raise InvalidArgument(f"{where}.model_name must not be empty", reason="INVALID_INSTANCE")
    if not inst.endpoints:
        raise InvalidArgument(f"{where} (id {inst.id}) has no endpoints", reason="INVALID_INSTANCE")
    seen_ids: set[int] = set()
    seen_addr: set[tuple[str, int]] = set()
    for i, ep in enumerate(inst.endpoints):
        at = f"{where}.endpoints[{i}]"
        if not is_ip(ep.ip) or ep.ip != ep.ip.strip():
            raise InvalidArgument(f"{at}.ip {ep.ip!r} is not an IPv4 or IPv6 address", reason="INVALID_ENDPOINT")
        if not MIN_BUSINESS_PORT <= ep.business_port <= MAX_PORT:
            raise InvalidArgument(
                f"{at}.business_port {ep.business_port} is outside [{MIN_BUSINESS_PORT}, {MAX_PORT}]",
                reason="INVALID_ENDPOINT",
            )
        for name, port in (("bootstrap_port", ep.bootstrap_port), ("kv_port", ep.kv_port),
                           ("kv_events_port", ep.kv_events_port), ("kv_events_replay_port", ep.kv_events_replay_port)):
            if port > MAX_PORT:
                raise InvalidArgument(f"{at}.{name} {port} is outside [0, {MAX_PORT}]", reason="INVALID_ENDPOINT")
        if ep.id in seen_ids:
            raise InvalidArgument(f"{at}.id {ep.id} is used twice in instance {inst.id}", reason="DUPLICATE_ENDPOINT")
        seen_ids.add(ep.id)
        addr = (normalize_ip(ep.ip), ep.business_port)
        if addr in seen_addr:
            raise InvalidArgument(
                f"{at} {ep.host_port} is listed twice in instance {inst.id}", reason="DUPLICATE_ENDPOINT"
            )
        seen_addr.add(addr)
        if inst.engine_type is EngineType.SGLANG and inst.role is Role.PREFILL and ep.bootstrap_port == 0:
            raise InvalidArgument(
                f"{at}: an SGLang prefill endpoint needs a bootstrap_port", reason="MISSING_BOOTSTRAP_PORT"
            )


def validate_batch(instances: Sequence[Instance]) -> None:
    """Validate each instance and reject duplicate ids or shared endpoints inside one request."""
    ids: dict[int, int] = {}
    owners: dict[tuple[str, int], int] = {}
    for i, inst in enumerate(instances):
        if inst.id in ids:
            raise InvalidArgument(
                f"instance id {inst.id} appears twice (instances[{ids[inst.id]}] and instances[{i}]); nothing applied",
                reason="DUPLICATE_INSTANCE_ID",
                metadata={"instance_id": str(inst.id)},
            )
        ids[inst.id] = i
        validate_instance(inst, f"instances[{i}]")
        for ep in inst.endpoints:
            addr = (normalize_ip(ep.ip), ep.business_port)
            other = owners.setdefault(addr, inst.id)
            if other != inst.id:
                raise InvalidArgument(
                    f"endpoint {ep.host_port} is claimed by instances {other} and {inst.id}; nothing applied",
                    reason="DUPLICATE_ENDPOINT",
                )
