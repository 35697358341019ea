"""Controller configuration: frozen dataclasses loaded strictly by ``motor_common.config``.

Field names of ``fault_tolerance_config`` are the seed's (SPEC §6); keep them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from motor_common import ports
from motor_common.grpc_server import ServerConfig
from motor_common.heartbeats import default_reattach_grace
from motor_common.logs import LogConfig
from motor_common.request_limits import MAX_LEASE_SEC
from motor_controller.alarm_webhook import AlarmWebhookConfig

# node_lost_routing_grace_sec: at most a day (a lost node is an operator's matter well before that).
MAX_NODE_LOST_ROUTING_GRACE_SEC = 86400.0


@dataclass(frozen=True)
class DpScaleDownConfig:
    request_timeout_sec: float = 5.0
    poll_interval_sec: float = 1.0
    execution_deadline_sec: float = 30.0

    def __post_init__(self) -> None:
        if min(self.request_timeout_sec, self.poll_interval_sec, self.execution_deadline_sec) <= 0:
            raise ValueError("dp_scale_down_config request_timeout_sec, poll_interval_sec and execution_deadline_sec "
                             "must be > 0")
        # The guard's lease is their sum, and a nodemanager refuses a lease above MAX_LEASE_SEC.
        if self.execution_deadline_sec + self.request_timeout_sec > MAX_LEASE_SEC:
            raise ValueError(f"dp_scale_down_config execution_deadline_sec + request_timeout_sec (the scale-down "
                             f"guard's lease) must be at most {MAX_LEASE_SEC:g} s")


@dataclass(frozen=True)
class FaultToleranceConfig:
    enable_fault_tolerance: bool = False
    enable_engine_relaunch: bool = True
    engine_relaunch_complete_timeout_sec: float = 180.0
    engine_relaunch_poll_interval_sec: float = 2.0
    engine_relaunch_dispatch_retries: int = 3
    engine_relaunch_nm_unreachable_threshold: int = 3
    # ENGINE_UNHEALTHY → await_recovery: how long the engine may take to be healthy again (then the
    # strategy fails and escalates to an engine relaunch), and how long it must stay healthy to count.
    await_recovery_timeout_sec: float = 60.0
    await_recovery_stable_sec: float = 3.0
    # Precision alarm → terminate the P/D pair (rescheduled), then clear the alarm everywhere
    # (docs/precision.md). Only with enable_fault_tolerance.
    enable_precision_recovery: bool = True
    enable_dp_scale_down: bool = False
    # No `enable_dp_scale_up`: a retired rank rejoins only through an engine relaunch (see
    # docs/fault-tolerance.md); an accepted key that did nothing was removed, so it is now rejected.
    dp_scale_down_config: DpScaleDownConfig = field(default_factory=DpScaleDownConfig)

    def __post_init__(self) -> None:
        if self.engine_relaunch_complete_timeout_sec <= 0:
            raise ValueError("engine_relaunch_complete_timeout_sec must be > 0")
        if self.engine_relaunch_poll_interval_sec <= 0:
            raise ValueError("engine_relaunch_poll_interval_sec must be > 0")
        if self.engine_relaunch_dispatch_retries < 0:
            raise ValueError("engine_relaunch_dispatch_retries must be >= 0")
        if self.engine_relaunch_nm_unreachable_threshold < 1:
            raise ValueError("engine_relaunch_nm_unreachable_threshold must be >= 1")
        if self.await_recovery_timeout_sec <= 0 or self.await_recovery_stable_sec < 0:
            raise ValueError("await_recovery_timeout_sec must be > 0 and await_recovery_stable_sec >= 0")


@dataclass(frozen=True)
class StoreConfig:
    # embedded = one SQLite file at `path`; etcd = keys under `etcd_prefix` on `etcd_endpoints`
    # (and the controller election is on: see `ha`).
    backend: Literal["embedded", "etcd"] = "embedded"
    path: str = "motor-controller.db"
    etcd_endpoints: list[str] = field(default_factory=list)
    etcd_prefix: str = "/motor/default/controller/"
    # Timeout of every etcd call of the store.
    etcd_timeout_sec: float = 2.0

    def __post_init__(self) -> None:
        if self.backend == "etcd" and not self.etcd_endpoints:
            raise ValueError("store.backend etcd needs store.etcd_endpoints")
        if self.etcd_timeout_sec <= 0:
            raise ValueError("store.etcd_timeout_sec must be > 0")
        if not self.etcd_prefix.startswith("/"):
            raise ValueError("store.etcd_prefix must start with '/'")


@dataclass(frozen=True)
class ControllerHaConfig:
    """Controller election (on when ``store.backend`` is etcd): only the holder of ``election_key``
    acts; the others answer NOT_SERVING and refuse mutating RPCs."""

    election_key: str = "/motor/default/controller-leader"
    lock_ttl_sec: float = 3.0  # clamped to [2, 8] like the coordinator's
    check_interval_sec: float = 0.5  # standby check, clamped to <= 2
    # Value written under the key; default the advertise address (else host name + pid).
    candidate_id: str = ""
    # This controller's gRPC address as peers reach it; default server.host:<bound port>.
    advertise_address: str = ""

    def __post_init__(self) -> None:
        if self.lock_ttl_sec <= 0 or self.check_interval_sec <= 0:
            raise ValueError("ha.lock_ttl_sec and ha.check_interval_sec must be > 0")


@dataclass(frozen=True)
class NodeRestartConfig:
    """How a node is restarted for node-level recovery (partial node loss, escalation).

    local: call the nodemanager's StopNode (it exits 75 and its supervisor — `motor up`, systemd —
    starts it again); kubernetes: delete the pod named after the node id in ``namespace`` so its
    controller recreates it."""

    backend: Literal["local", "kubernetes"] = "local"
    namespace: str = "default"
    # kubernetes: kubeconfig file used out of cluster; "" = the pod's ServiceAccount when in a
    # cluster (KUBERNETES_SERVICE_HOST set), else $KUBECONFIG, else ~/.kube/config.
    kubeconfig: str = ""
    # kubernetes: timeout of one call to the API server.
    api_timeout_sec: float = 10.0
    # How long a node restart waits for the restarted nodes to be gone before it reports FAILED.
    wait_timeout_sec: float = 30.0

    def __post_init__(self) -> None:
        if self.wait_timeout_sec <= 0:
            raise ValueError("node_restart.wait_timeout_sec must be > 0")
        if self.api_timeout_sec <= 0:
            raise ValueError("node_restart.api_timeout_sec must be > 0")
        if self.backend == "kubernetes" and not self.namespace:
            raise ValueError("node_restart.namespace is required for the kubernetes backend")


@dataclass(frozen=True)
class ControllerConfig:
    server: ServerConfig = field(default_factory=lambda: ServerConfig(port=ports.CONTROLLER_GRPC))
    log: LogConfig = field(default_factory=LogConfig)
    # Coordinator gRPC addresses (host:port), each gets its own pusher.
    coordinators: list[str] = field(default_factory=list)
    # Heartbeat interval told to nodemanagers at registration.
    heartbeat_interval_sec: float = 1.0
    # A node whose last heartbeat is older than this is lost (about 3x the interval).
    heartbeat_timeout_sec: float = 3.0
    # After a restart or an election (also after the store was unavailable) this controller waits
    # this long for the nodemanagers' heartbeat streams to re-attach before it judges any node it has
    # not heard from since: no node is marked lost and no instance leaves the coordinators only
    # because of that. Unset = the nodemanagers' reconnect back-off cap (5 s) + heartbeat_interval_sec
    # + heartbeat_timeout_sec (9 s with the defaults). Must be >= heartbeat_timeout_sec.
    reattach_grace_sec: float | None = None
    # Static stability: an ACTIVE instance whose node is lost (heartbeats overdue) goes INACTIVE, but
    # stays in the coordinators' routing for this long, unless its node comes back with another verdict
    # first: its engines may still serve (a nodemanager that died re-adopts them on restart), and
    # whether they do is the coordinators' call (readiness probes, circuit breaker, failover). 0 = off:
    # a lost node takes its instances out of routing at once. At most 86400.
    node_lost_routing_grace_sec: float = 300.0
    reconcile_interval_sec: float = 0.5
    # Periodic full sync with every coordinator (the final safety net).
    sync_interval_sec: float = 5.0
    # Minimum spacing of full SET retries after a failed SET.
    set_retry_interval_sec: float = 1.0
    # Timeout of every call to a nodemanager or a coordinator.
    rpc_timeout_sec: float = 5.0
    # A start command not confirmed by heartbeats is re-sent after this long.
    start_retry_interval_sec: float = 5.0
    # DP master RPC port passed to engines of multi-node instances (vLLM default).
    dp_master_port: int = 29550
    store: StoreConfig = field(default_factory=StoreConfig)
    ha: ControllerHaConfig = field(default_factory=ControllerHaConfig)
    fault_tolerance_config: FaultToleranceConfig = field(default_factory=FaultToleranceConfig)
    node_restart: NodeRestartConfig = field(default_factory=NodeRestartConfig)
    # Alarm delivery (ALARM/CLEAR to a webhook or Alertmanager): motor_controller.alarm_webhook.
    alarms: AlarmWebhookConfig = field(default_factory=AlarmWebhookConfig)

    def reattach_grace(self) -> float:
        if self.reattach_grace_sec is not None:
            return self.reattach_grace_sec
        return default_reattach_grace(self.heartbeat_interval_sec, self.heartbeat_timeout_sec)

    def __post_init__(self) -> None:
        for name in (
            "heartbeat_interval_sec",
            "heartbeat_timeout_sec",
            "reconcile_interval_sec",
            "sync_interval_sec",
            "set_retry_interval_sec",
            "rpc_timeout_sec",
            "start_retry_interval_sec",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.heartbeat_timeout_sec <= self.heartbeat_interval_sec:
            raise ValueError("heartbeat_timeout_sec must be greater than heartbeat_interval_sec")
        if self.reattach_grace_sec is not None and self.reattach_grace_sec < self.heartbeat_timeout_sec:
            raise ValueError("reattach_grace_sec must be >= heartbeat_timeout_sec (unset = derived from the "
                             "heartbeat settings and the nodemanagers' reconnect back-off)")
        if not 0 <= self.node_lost_routing_grace_sec <= MAX_NODE_LOST_ROUTING_GRACE_SEC:
            raise ValueError(f"node_lost_routing_grace_sec must be in [0, {MAX_NODE_LOST_ROUTING_GRACE_SEC:g}] "
                             "(0 = a lost node's instances leave routing at once)")
        if not 1 <= self.dp_master_port <= 65535:
            raise ValueError("dp_master_port must be in [1, 65535]")
        for addr in self.coordinators:
            if ":" not in addr:
                raise ValueError(f"coordinator address {addr!r} must be host:port")
