"""The start command: payload checks (INVALID_ARGUMENT) and checks against this node
(FAILED_PRECONDITION, "Start command validation failed: ..."). Pure, no I/O.

The servicer converts the protobuf into :class:`StartCommand` with :func:`parse`; the node then
calls :func:`validate_for_node` before touching any state, so a rejected call changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from motor_common.domain import (
    MAX_PORT,
    MIN_BUSINESS_PORT,
    Endpoint,
    EngineType,
    Role,
    is_ip,
    normalize_ip,
)
from motor_common.errors import FailedPrecondition, InvalidArgument

# A master address: a host name, an IPv4 address or an IPv6 literal (bracketed or not).
_HOST = re.compile(r"\[?[A-Za-z0-9.:_-]{1,253}\]?")

VALIDATION_PREFIX = "Start command validation failed: "


@dataclass(frozen=True)
class StartCommand:
    instance_id: int
    job_name: str
    role: Role
    engine_type: EngineType
    model_name: str
    endpoints: tuple[Endpoint, ...]
    node_rank: int = 0
    num_nodes: int = 1
    master_address: str = ""
    master_port: int = 0
    dp_size: int = 1
    generation: int = 0
    peers: tuple[Endpoint, ...] = ()

    def same_launch(self, other: StartCommand) -> bool:
        """Whether *other* would launch exactly the same engines (generation aside)."""
        a = {**self.__dict__, "generation": 0}
        b = {**other.__dict__, "generation": 0}
        return a == b

    def d2d_peers(self) -> tuple[Endpoint, ...]:
        """Decode-side peers, without this node's own endpoints (filtered by endpoint id)."""
        own = {e.id for e in self.endpoints}
        return tuple(p for p in self.peers if p.id not in own)


def check_payload(cmd: StartCommand) -> None:
    """Field presence and shape; raises InvalidArgument."""
    missing = [
        name
        for name, present in (
            ("instance_id", cmd.instance_id != 0),
            ("job_name", bool(cmd.job_name)),
            ("model_name", bool(cmd.model_name)),
            ("endpoints", bool(cmd.endpoints)),
        )
        if not present
    ]
    if missing:
        raise InvalidArgument(
            f"Invalid start command payload: missing {', '.join(missing)}", reason="INVALID_START_COMMAND"
        )
    ids = [e.id for e in cmd.endpoints]
    if len(set(ids)) != len(ids):
        raise InvalidArgument("Invalid start command payload: duplicate endpoint ids", reason="INVALID_START_COMMAND")
    if cmd.num_nodes < 1 or cmd.node_rank >= max(cmd.num_nodes, 1):
        raise InvalidArgument(
            f"Invalid start command payload: node_rank {cmd.node_rank} outside [0, num_nodes={cmd.num_nodes})",
            reason="INVALID_START_COMMAND",
        )
    if cmd.dp_size < len(cmd.endpoints):
        raise InvalidArgument(
            f"Invalid start command payload: dp_size {cmd.dp_size} < {len(cmd.endpoints)} endpoints",
            reason="INVALID_START_COMMAND",
        )
    # What reaches an engine's command line or environment: no control characters (a NUL made the
    # spawn itself fail, an INTERNAL error), a host name or IP for the master, IPs for peers.
    for name, value in (("job_name", cmd.job_name), ("model_name", cmd.model_name)):
        if not value.isprintable():
            raise InvalidArgument(f"Invalid start command payload: {name} has a control character",
                                  reason="INVALID_START_COMMAND")
    if cmd.master_address and not _HOST.fullmatch(cmd.master_address):
        raise InvalidArgument(
            f"Invalid start command payload: master_address {cmd.master_address[:100]!r} is not a host name or IP "
            "address", reason="INVALID_START_COMMAND")
    bad_peer = next((p for p in cmd.peers if not is_ip(p.ip)), None)
    if bad_peer is not None:
        raise InvalidArgument(f"Invalid start command payload: peer {bad_peer.id}: {bad_peer.ip[:100]!r} is not an "
                              "IPv4 or IPv6 address", reason="INVALID_START_COMMAND")


def _fail(detail: str, reason: str) -> FailedPrecondition:
    return FailedPrecondition(VALIDATION_PREFIX + detail, reason=reason)


def validate_for_node(
    cmd: StartCommand, *, job_name: str, node_ip: str, endpoint_count: int, role: Role | None = None,
    engine_type: EngineType | None = None, model_name: str | None = None,
) -> None:
    """The command must target this node; raises FailedPrecondition naming the first mismatch."""
    if cmd.job_name != job_name:
        raise _fail(f"job name {cmd.job_name!r} != node job name {job_name!r}", "JOB_NAME_MISMATCH")
    if role is not None and cmd.role != role:
        raise _fail(f"role {cmd.role.value} != node role {role.value}", "ROLE_MISMATCH")
    if engine_type is not None and cmd.engine_type != engine_type:
        raise _fail(f"engine type {cmd.engine_type.value} != node engine type {engine_type.value}",
                    "ENGINE_TYPE_MISMATCH")
    if model_name is not None and cmd.model_name != model_name:
        raise _fail(f"model name {cmd.model_name[:200]!r} != node model name {model_name!r}", "MODEL_NAME_MISMATCH")
    if len(cmd.endpoints) != endpoint_count:
        raise _fail(
            f"{len(cmd.endpoints)} endpoints != {endpoint_count} endpoints of this node", "ENDPOINT_COUNT_MISMATCH"
        )
    check_endpoints(cmd.endpoints, node_ip)


def check_endpoints(endpoints: Iterable[Endpoint], node_ip: str) -> None:
    own = normalize_ip(node_ip)
    for ep in endpoints:
        if not is_ip(ep.ip):
            raise _fail(f"endpoint {ep.id}: {ep.ip!r} is not an IPv4 or IPv6 address", "INVALID_ENDPOINT_IP")
        if normalize_ip(ep.ip) != own:
            raise _fail(f"endpoint {ep.id}: ip {ep.ip} != node ip {node_ip}", "ENDPOINT_IP_MISMATCH")
        if not MIN_BUSINESS_PORT <= ep.business_port <= MAX_PORT:
            raise _fail(
                f"endpoint {ep.id}: business port {ep.business_port} outside [{MIN_BUSINESS_PORT}, {MAX_PORT}]",
                "INVALID_ENDPOINT_PORT",
            )
