"""NodeManager configuration: one strict, frozen schema, role-organised.

The file holds the node identity and defaults at the top level, plus optional per-role sections
(``prefill``, ``decode``, ``union``). The section named by this node's ``role`` replaces the
matching top-level keys (whole values: a role's ``engine`` section replaces the top-level
``engine``). Every key anywhere is checked by :func:`motor_common.config.load_config`: an unknown key
is a ``ConfigError`` naming it (the process exits 2).

Where the file comes from: ``USER_CONFIG_PATH``, else ``CONFIG_PATH``, else ``--config FILE``.
Environment overrides: ``MOTOR_NODEMANAGER__SECTION__KEY=value``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from motor_common import ports
from motor_common.config import load_config
from motor_common.domain import EngineType, Role
from motor_common.errors import ConfigError
from motor_common.grpc_server import ServerConfig
from motor_common.logs import LogConfig

ENV_PREFIX = "MOTOR_NODEMANAGER"
RoleName = Literal["prefill", "decode", "union"]


@dataclass(frozen=True)
class HealthConfig:
    """Polling of each engine's native ``/health``."""

    poll_interval_sec: float = 1.0
    timeout_sec: float = 5.0
    port_wait_sec: float = 60.0
    startup_grace_sec: float = 120.0
    # Believe an engine's first 200 on /health (after each launch or relaunch) only once the port is
    # seen served by the launched process or a descendant (Linux /proc). Turn off only when an
    # engine.command wrapper serves the port from outside its own process tree (a container
    # runtime's port proxy or NAT): then any program answering on the port counts as the engine.
    verify_port_owner: bool = True
    # Failed probes in a row before the endpoint counts as ABNORMAL (a once-NORMAL engine is then
    # reported dead and relaunched): one slow answer is not a death. A process exit counts at once.
    failure_threshold: int = 3
    # Consecutive daemon intervals an (once NORMAL) endpoint may stay ABNORMAL before self-termination.
    abnormal_threshold: int = 5

    def __post_init__(self) -> None:
        if self.poll_interval_sec <= 0 or self.timeout_sec <= 0:
            raise ValueError("health.poll_interval_sec and health.timeout_sec must be > 0")
        if self.abnormal_threshold < 1:
            raise ValueError("health.abnormal_threshold must be >= 1")
        if not 1 <= self.failure_threshold <= 100:
            raise ValueError("health.failure_threshold must be between 1 and 100")


@dataclass(frozen=True)
class KvEventsConfig:
    """KV-cache events (docs/kv-events.md): every engine is launched with the engine's own
    ``--kv-events-config`` (ZMQ publisher on a planned port, replay socket on another) and the
    ports are announced in registration, so coordinators can route by what engines hold."""

    enable: bool = False
    # ZMQ topic of every batch (the engines' "topic").
    topic: str = "kv-events"
    # Also open the replay socket (the coordinator catches up from it after a reconnect).
    replay: bool = True

    def __post_init__(self) -> None:
        if len(self.topic) > 128 or any(not c.isprintable() for c in self.topic):
            raise ValueError("engine.kv_events.topic must be at most 128 printable characters")


@dataclass(frozen=True)
class EngineConfig:
    """How engine processes are launched (see ``launch.py``)."""

    # simulator | vllm | sglang; None = the native CLI of engine_type.
    launcher: Literal["simulator", "vllm", "sglang"] | None = None
    # argv prefix replacing the launcher's (e.g. ["/opt/venv/bin/vllm", "serve"]).
    command: list[str] | None = None
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    # Model path/id given to the engine; defaults to model_name.
    model_path: str | None = None
    kv_connector: str = "NixlConnector"
    # Seconds between SIGTERM and SIGKILL of an engine's process group.
    stop_timeout_sec: float = 10.0
    # Directory for per-engine stdout/stderr files; None = inherit the nodemanager's.
    log_dir: str | None = None
    kv_events: KvEventsConfig = field(default_factory=KvEventsConfig)
    # Engines outlive a nodemanager that dies abnormally (SIGKILL, OOM kill, crash) and the restarted
    # nodemanager adopts them (same pid, start time and launch plan) instead of launching new ones.
    # Off: engines get the parent-death signal and die with the nodemanager. Needs a state file.
    adopt_on_restart: bool = True
    # Where the launched engines are recorded; None = <log_dir>/<node id>.engines.json. Neither set:
    # re-adoption is off (engines die with the nodemanager), with a warning at start.
    state_file: str | None = None


@dataclass(frozen=True)
class RegistrationConfig:
    max_attempts: int = 5
    # Back-off before attempt n+1 is base * 2**(n-1): 2, 4, 8, 16 s with the default.
    backoff_base_sec: float = 2.0
    rpc_timeout_sec: float = 5.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("registration.max_attempts must be >= 1")
        if self.rpc_timeout_sec <= 0:  # a 0 timeout fails every RegisterNode call at once
            raise ValueError("registration.rpc_timeout_sec must be > 0")


@dataclass(frozen=True)
class FaultToleranceConfig:
    enable_fault_tolerance: bool = False
    enable_engine_relaunch: bool = True
    # Bound of one relaunch: the relaunched engines must be NORMAL within it, else RestartEngine
    # answers INTERNAL (engines stopped, self-termination unfrozen).
    engine_restart_wait_timeout_sec: float = 180.0
    engine_restart_freeze_sec: float = 720.0
    zmq_pub_port: int | None = None
    enable_dp_scale_down: bool = False
    # Retry spacing of a death/fault report the controller did not accept.
    report_retry_interval_sec: float = 1.0
    # Timeout of one ReportFault call.
    report_timeout_sec: float = 2.0
    # Wait before re-subscribing a fault-reporter ZMQ socket after an error (seed: 5 s).
    zmq_retry_interval_sec: float = 5.0

    def __post_init__(self) -> None:
        if self.report_retry_interval_sec <= 0 or self.report_timeout_sec <= 0 or self.zmq_retry_interval_sec <= 0:
            raise ValueError("fault_tolerance_config retry intervals and timeouts must be > 0")
        if self.engine_restart_wait_timeout_sec <= 0:
            raise ValueError("fault_tolerance_config.engine_restart_wait_timeout_sec must be > 0")
        if self.engine_restart_freeze_sec <= 0:
            raise ValueError("fault_tolerance_config.engine_restart_freeze_sec must be > 0")
        if self.zmq_pub_port is not None and not 1 <= self.zmq_pub_port <= 65535:
            raise ValueError(f"zmq_pub_port {self.zmq_pub_port} is outside [1, 65535]")


@dataclass(frozen=True)
class SnapshotConfig:
    """Container snapshot mode (see ``snapshot.py``): no config watcher, SIGUSR1 = checkpoint,
    SIGUSR2 = restored; the metadata JSON is validated at start-up and read again on restore."""

    enable_snapshot: bool = False
    metadata_path: str | None = None


@dataclass(frozen=True)
class KvCacheStoreConfig:
    """The KV-cache store worker (see ``services.py``), launched from ``command`` as a process group."""

    enable: bool = False
    backend: str = "mooncake"
    # combined: engine + KV store on this node; separated: KV store only (no registration/heartbeat).
    mode: Literal["combined", "separated"] = "combined"
    # argv of the worker (e.g. ["mooncake_master", "--port", "50051"]); required when enable is on.
    command: list[str] | None = None
    # The worker's listening port: health = process alive and this port accepting (0 = process only).
    port: int = 0
    env: dict[str, str] = field(default_factory=dict)
    stop_timeout_sec: float = 10.0
    log_dir: str | None = None

    def __post_init__(self) -> None:
        if self.enable and not self.command:
            raise ValueError(
                "kv_cache_store_config.command must be set when kv_cache_store_config.enable is on"
            )
        if not 0 <= self.port <= 65535:
            raise ValueError("kv_cache_store_config.port must be in [0, 65535]")


@dataclass(frozen=True)
class RoleSection:
    """Per-role overrides; a key set here replaces the top-level key for nodes of that role."""

    model_name: str | None = None
    engine_type: Literal["vllm", "sglang"] | None = None
    nodes_per_instance: int | None = None
    endpoints_per_node: int | None = None
    base_port: int | None = None
    local_world_size: int | None = None
    device_count: int | None = None
    engine: EngineConfig | None = None
    health: HealthConfig | None = None


@dataclass(frozen=True)
class NodeManagerConfig:
    job_name: str = "motor"
    role: RoleName | None = None  # None: from the ROLE environment variable
    node_id: str = ""  # "": POD_NAME, else hostname:job_name:node_rank (stable across restarts)
    engine_type: Literal["vllm", "sglang"] = "vllm"
    model_name: str = "model"
    ip: str = ""  # "": POD_IP, else 127.0.0.1
    controller_address: str = f"127.0.0.1:{ports.CONTROLLER_GRPC}"
    controller_tls_ca_file: str | None = None
    server: ServerConfig = field(default_factory=lambda: ServerConfig(port=ports.NODEMANAGER_GRPC))
    node_rank: int = 0
    nodes_per_instance: int = 1
    endpoints_per_node: int = 1
    # Engine business ports are base_port + i; 0 = pick free ports at start-up.
    base_port: int = 0
    local_world_size: int = 1
    visible_devices_env: Literal["CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES"] = "CUDA_VISIBLE_DEVICES"
    device_count: int = 8
    heartbeat_interval_seconds: float = 3.0
    daemon_loop_interval: float = 5.0
    config_watch_interval_sec: float = 2.0
    # StopNode stops the engines, answers, then exits (75) after this delay.
    stop_exit_delay_sec: float = 0.3
    health: HealthConfig = field(default_factory=HealthConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    registration: RegistrationConfig = field(default_factory=RegistrationConfig)
    fault_tolerance_config: FaultToleranceConfig = field(default_factory=FaultToleranceConfig)
    snapshot_config: SnapshotConfig = field(default_factory=SnapshotConfig)
    kv_cache_store_config: KvCacheStoreConfig = field(default_factory=KvCacheStoreConfig)
    log: LogConfig = field(default_factory=LogConfig)
    prefill: RoleSection | None = None
    decode: RoleSection | None = None
    union: RoleSection | None = None

    def __post_init__(self) -> None:
        if self.endpoints_per_node < 1:
            raise ValueError("endpoints_per_node must be >= 1")
        if self.nodes_per_instance < 1 or not 0 <= self.node_rank < self.nodes_per_instance:
            raise ValueError("node_rank must be in [0, nodes_per_instance)")
        if self.local_world_size < 1 or self.device_count < 1:
            raise ValueError("local_world_size and device_count must be >= 1")
        blocks = 5 if self.engine.kv_events.enable else 3  # ports per endpoint (ports.plan_endpoints)
        if self.base_port and not 1024 <= self.base_port <= 65536 - blocks * self.endpoints_per_node:
            raise ValueError("base_port must be 0 or leave room for every endpoint below 65536")
        if self.heartbeat_interval_seconds <= 0 or self.daemon_loop_interval <= 0:
            raise ValueError("heartbeat_interval_seconds and daemon_loop_interval must be > 0")
        if self.config_watch_interval_sec < 0.05:  # 0 polled the file in a busy loop (74 % of a core)
            raise ValueError("config_watch_interval_sec must be at least 0.05")

    # --- derived views -------------------------------------------------------------------
    @property
    def role_enum(self) -> Role:
        if self.role is None:
            raise ConfigError("role is not set: set 'role' in the config or the ROLE environment variable")
        return Role(self.role)

    @property
    def engine_type_enum(self) -> EngineType:
        return EngineType(self.engine_type)

    @property
    def launcher(self) -> str:
        return self.engine.launcher or self.engine_type

    @property
    def model_path(self) -> str:
        return self.engine.model_path or self.model_name

    @property
    def registers(self) -> bool:
        """False for a KV-store-only node (separated mode): no registration, no heartbeat."""
        kv = self.kv_cache_store_config
        return not (kv.enable and kv.mode == "separated")


def resolve(cfg: NodeManagerConfig, environ: Mapping[str, str]) -> NodeManagerConfig:
    """Fill role/ip from the environment and apply the role's section."""
    role = cfg.role or environ.get("ROLE") or None
    if role is None:
        raise ConfigError("role is not set: set 'role' in the config or the ROLE environment variable")
    if role not in ("prefill", "decode", "union"):
        raise ConfigError(f"role: {role!r} is not one of 'prefill', 'decode', 'union'")
    ip = cfg.ip or environ.get("POD_IP") or "127.0.0.1"
    if _loopback(cfg.server.host) and not _loopback(ip):
        raise ConfigError(
            f"server.host {cfg.server.host} is a loopback address but this node advertises ip {ip} "
            "(from 'ip' or POD_IP): the controller could not reach it; set server.host to 0.0.0.0 "
            f"or {ip} (MOTOR_NODEMANAGER__SERVER__HOST)"
        )
    section: RoleSection | None = getattr(cfg, role)
    changes: dict[str, object] = {"role": role, "ip": ip}
    if section is not None:
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if value is not None:
                changes[f.name] = value
    try:
        return dataclasses.replace(cfg, **changes)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ConfigError(f"role section '{role}': {exc}") from exc


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def config_path(cli_path: str | None, environ: Mapping[str, str]) -> str | None:
    return environ.get("USER_CONFIG_PATH") or environ.get("CONFIG_PATH") or cli_path


def load(path: str | None, environ: Mapping[str, str] | None = None) -> NodeManagerConfig:
    env = os.environ if environ is None else environ
    raw = load_config(NodeManagerConfig, path, env_prefix=ENV_PREFIX, environ=env)
    return resolve(raw, env)


# Keys whose change needs a restart (logged by the config watcher, not applied).
RESTART_KEYS = (
    "server",
    "ip",
    "node_id",
    "job_name",
    "role",
    "engine_type",
    "base_port",
    "endpoints_per_node",
    "local_world_size",
    "device_count",
    "visible_devices_env",
    "controller_address",
    "snapshot_config",
    "kv_cache_store_config",
)


def restart_needed(old: NodeManagerConfig, new: NodeManagerConfig) -> list[str]:
    return [k for k in RESTART_KEYS if getattr(old, k) != getattr(new, k)]
