"""Domain types shared by every service: frozen dataclasses, no gRPC.

Protos are converted to these at the servicer boundary (``motor_common.convert``); the inside of a
service never handles ``*_pb2`` objects.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass, field

from motor_common.ports import host_port

MIN_BUSINESS_PORT = 1024
MAX_PORT = 65535
# Instance ids are at most MAX_INSTANCE_ID = 2^53 - 1, so they survive every language's default
# number type (a JSON number read by JavaScript or jq, a double): the wire type stays uint64.
# Ids derived by the standalone register CLI set STANDALONE_ID_BIT (bit 52) over a 52-bit hash;
# controller-assigned ids are a 52-bit hash that never sets it.
MAX_INSTANCE_ID = (1 << 53) - 1
STANDALONE_ID_BIT = 1 << 52
INSTANCE_HASH_MASK = STANDALONE_ID_BIT - 1


class Role(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    UNION = "union"


class EngineType(enum.Enum):
    VLLM = "vllm"
    SGLANG = "sglang"


class InstanceStatus(enum.Enum):
    AVAILABLE = "available"
    UNAVAILABLE = "unavailable"
    PAUSED = "paused"


class EndpointStatus(enum.Enum):
    INITIAL = "initial"
    NORMAL = "normal"
    ABNORMAL = "abnormal"
    PAUSED = "paused"
    RETIRED = "retired"


@dataclass(frozen=True, order=True)
class Endpoint:
    id: int
    ip: str
    business_port: int
    bootstrap_port: int = 0
    kv_port: int = 0
    dp_rank: int = 0
    node_id: str = ""
    # The engine's KV-cache event publisher (ZMQ PUB) and replay (ROUTER) ports; 0 = none.
    kv_events_port: int = 0
    kv_events_replay_port: int = 0

    @property
    def host_port(self) -> str:
        return host_port(self.ip, self.business_port)

    @property
    def base_url(self) -> str:
        return f"http://{self.host_port}"

    def identity(self) -> tuple[str, int, int, int, int]:
        """What makes two endpoints the same engine, independent of bookkeeping fields."""
        return (normalize_ip(self.ip), self.business_port, self.bootstrap_port, self.kv_port, self.dp_rank)


@dataclass(frozen=True)
class Instance:
    id: int
    role: Role
    job_name: str
    model_name: str
    engine_type: EngineType
    endpoints: tuple[Endpoint, ...]
    status: InstanceStatus = InstanceStatus.AVAILABLE
    labels: tuple[tuple[str, str], ...] = field(default=())

    def endpoint_group(self) -> frozenset[tuple[str, int, int, int, int]]:
        """The endpoint group as an order-independent set of identities."""
        return frozenset(e.identity() for e in self.endpoints)

    def identity(self) -> tuple[Role, str, frozenset[tuple[str, int, int, int, int]]]:
        """Role, job name and endpoint group: what ADD/DEL compare (order-independent)."""
        return (self.role, self.job_name, self.endpoint_group())

    def same_identity(self, other: Instance) -> bool:
        return self.identity() == other.identity()


def normalize_ip(ip: str) -> str:
    """Canonical text of an IPv4/IPv6 address (brackets stripped; an IPv4-mapped IPv6 address
    ``::ffff:a.b.c.d`` as the IPv4 address it reaches); unchanged if not an IP."""
    raw = ip.strip().strip("[]")
    try:
        addr = ipaddress.ip_address(raw)
    except ValueError:
        return raw
    mapped = addr.ipv4_mapped if isinstance(addr, ipaddress.IPv6Address) else None
    return str(mapped if mapped is not None else addr)


def is_ip(ip: str) -> bool:
    """An IPv4 or IPv6 address (an IPv6 zone id of visible ASCII only: the text goes into URLs,
    log lines and metric labels)."""
    raw = ip.strip().strip("[]")
    if not (raw.isascii() and raw.isprintable()) or " " in raw:
        return False
    try:
        ipaddress.ip_address(raw)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Capabilities:
    """Fault-tolerance features a node supports; every node of an instance must agree."""

    fault_tolerance: bool = False
    engine_relaunch: bool = False
    dp_scale_down: bool = False


@dataclass(frozen=True)
class NodeSpec:
    """What a nodemanager declares about itself when it registers."""

    node_id: str
    job_name: str
    role: Role
    ip: str
    admin_port: int
    engine_type: EngineType
    model_name: str
    node_rank: int
    nodes_per_instance: int
    # Endpoints with node-local dp ranks.
    endpoints: tuple[Endpoint, ...]
    capabilities: Capabilities = field(default_factory=Capabilities)
    local_world_size: int = 0

    def identity(self) -> tuple[str, Role, int, str]:
        """What may not change under one node id while the node is alive."""
        return (self.job_name, self.role, self.node_rank, self.ip)

    @property
    def admin_address(self) -> str:
        return host_port(self.ip, self.admin_port)


@dataclass(frozen=True)
class EndpointHealth:
    """Health of one engine endpoint, as a nodemanager reports it."""

    endpoint_id: int
    status: EndpointStatus
    generation: int = 0
    pid: int = 0
    was_normal: bool = False
    detail: str = ""
