"""Plan of a local fleet for ``motor up``: pure data, no processes, no I/O.

A :class:`FleetPlan` names every program of the fleet (coordinator(s), controller, gateway — none
when the coordinator serves the OpenAI front itself, :mod:`motor_cli.topology` — and one
nodemanager per node) with its argv and its configuration as plain data; ``motor up`` writes the
configurations to files and runs the programs. Keeping the plan pure makes it testable and lets
an operator see exactly what would run (``motor up --dry-run``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from motor_cli.topology import Topology, check_topology, front_section
from motor_common.errors import ConfigError
from motor_common.ports import host_port

FLEET_SECTIONS = ("controller", "coordinator", "gateway", "nodemanager")
# etcd key prefix of a `motor up --ha` fleet (coordinator + controller elections, controller store).
HA_PREFIX = "/motor/up"


@dataclass(frozen=True)
class FleetOptions:
    prefill: int = 1
    decode: int = 1
    union: int = 0
    engine: Literal["vllm", "sglang"] = "vllm"
    model: str = "tiny"
    host: str = "127.0.0.1"
    # The OpenAI front's port: the gateway's, or the coordinator's with co_located.
    gateway_port: int = 8000
    # Gateway worker processes on the one port (gateway config `workers`, docs/operations.md).
    gateway_workers: int = 1
    # Co-located front worker processes (coordinator config `http.workers`, docs/coordinator.md);
    # None: --front-workers not given.
    front_workers: int | None = None
    coordinator_ports: tuple[int, ...] = (9100,)
    controller_port: int = 9200
    node_ports: tuple[int, ...] = ()
    state_dir: Path = Path(".motor/up")
    # The operator key of people and the CLI (``fleet.json``'s ``management_key_file``); every
    # program's own key is in state_dir/keys (:func:`fleet_keys`).
    key_file: Path = Path(".motor/up/keys/operator.key")
    heartbeat_interval_sec: float = 1.0
    heartbeat_timeout_sec: float = 3.0
    zero_latency: bool = False
    # Route prefill by the engines' own KV-cache events (docs/kv-events.md): engines publish them,
    # the coordinator runs the kv_events policy with the simulator's tokenizer.
    kv_events: bool = False
    etcd_endpoint: str | None = None
    # Mutual TLS on every gRPC channel and HTTPS on the gateway, with certificates from a
    # throw-away CA in state_dir/tls (written by `motor up --tls`).
    tls: bool = False
    # Per-program overrides from --config (deep-merged into the generated configuration).
    overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # No gateway: the coordinator serves the OpenAI front on gateway_port (motor_cli.topology).
    co_located: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.gateway_workers <= 256:
            raise ConfigError(f"--gateway-workers must be in [1, 256], got {self.gateway_workers}")
        if self.front_workers is not None and not 1 <= self.front_workers <= 64:
            raise ConfigError(f"--front-workers must be in [1, 64], got {self.front_workers}")
        if min(self.prefill, self.decode, self.union) < 0:
            raise ConfigError("node counts must be >= 0")
        if self.union == 0 and (self.prefill == 0 or self.decode == 0):
            raise ConfigError("a PD fleet needs at least one prefill and one decode node (or use --union)")
        if len(self.node_ports) != self.node_count:
            raise ConfigError(f"need {self.node_count} nodemanager ports, got {len(self.node_ports)}")
        unknown = set(self.overrides) - set(FLEET_SECTIONS)
        if unknown:
            raise ConfigError(
                f"unknown fleet config section(s) {', '.join(sorted(unknown))}; known: {', '.join(FLEET_SECTIONS)}"
            )
        for name, section in self.overrides.items():
            if not isinstance(section, Mapping):
                raise ConfigError(f"fleet config section {name} must be a mapping of {name} settings, "
                                  f"got {type(section).__name__}")
        check_topology(self.topology, coordinators=len(self.coordinator_ports), gateway_workers=self.gateway_workers,
                       front_workers=self.front_workers, overrides=self.overrides)

    @property
    def topology(self) -> Topology:
        return Topology(self.co_located)

    @property
    def node_count(self) -> int:
        return self.prefill + self.decode + self.union


@dataclass(frozen=True)
class ProgramSpec:
    name: str
    kind: Literal["coordinator", "controller", "gateway", "nodemanager", "etcd"]
    argv: tuple[str, ...]
    config: Mapping[str, Any]
    config_path: Path
    ports_file: Path
    # Port the program serves (gRPC, or HTTP for the gateway).
    port: int
    role: str = ""

    @property
    def writes_ports_file(self) -> bool:
        """Motor's programs write *ports_file* once started (their last start-up step); etcd none."""
        return self.kind != "etcd"


@dataclass(frozen=True)
class FleetPlan:
    options: FleetOptions
    programs: tuple[ProgramSpec, ...]
    keys: FleetKeys

    def of_kind(self, kind: str) -> list[ProgramSpec]:
        return [p for p in self.programs if p.kind == kind]

    @property
    def topology(self) -> Topology:
        return self.options.topology

    @property
    def front_workers(self) -> int:
        """Worker processes of the OpenAI front as configured (the gateway's ``workers``, or the
        co-located coordinator's ``http.workers``, fleet config included)."""
        front = self.of_kind(self.topology.front_program)[0]
        config = front.config.get("http", {}) if self.options.co_located else front.config
        workers = config.get("workers", 1)
        return workers if isinstance(workers, int) else 1

    @property
    def gateway_url(self) -> str:
        """The OpenAI front's URL (the gateway's, or the co-located coordinator's)."""
        scheme = "https" if self.options.tls else "http"
        return f"{scheme}://{host_port(self.options.host, self.options.gateway_port)}"

    @property
    def tls_names(self) -> list[str]:
        """Who gets a certificate with --tls: every program and the CLI (`cli`)."""
        return [p.name for p in self.programs] + ["cli"]

    @property
    def controller_address(self) -> str:
        return host_port(self.options.host, self.options.controller_port)

    @property
    def coordinator_addresses(self) -> list[str]:
        return [host_port(self.options.host, p) for p in self.options.coordinator_ports]



def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class FleetKeys:
    """Where a local fleet's credentials live: one key per role and per program, so that no
    program holds a key that opens another role's RPCs (docs/security.md, Credentials).

    - ``operator`` (people, the CLI) and the controller's own key are the operator keys every
      program accepts on its admin RPCs (``operators``: ``operator: …``, ``controller: …``);
    - each nodemanager and coordinator presents its own node key to the controller (``nodes``:
      ``prefill-0: …``, ``coordinator: …``), which opens ControllerService only;
    - the gateway presents its own inference key to the coordinators (``inference``:
      ``gateway: …``), which opens DispatchService only; ``application`` is a second inference
      key for programs that call DispatchService themselves (``fleet.json``'s
      ``inference_key_file``). The gateway's OpenAI front stays open (a local fleet)."""

    operator: Path
    application: Path
    operators: Path
    nodes: Path
    inference: Path
    own: Mapping[str, Path]  # program name -> the key it presents when it calls another program

    def named(self, kind: str) -> dict[str, Path]:
        """name -> own key file of the keys listed in the *kind* file (operators/nodes/inference)."""
        return {n: p for n, p in self.own.items() if self.kind_of(n) == kind}

    @staticmethod
    def kind_of(program: str) -> str:
        if program == "controller":
            return "operators"
        return "inference" if program == "gateway" else "nodes"


def fleet_keys(opts: FleetOptions, programs: list[tuple[str, str]]) -> FleetKeys:
    """The key files of a fleet whose programs are *programs* ((name, kind) pairs)."""
    d = opts.state_dir / "keys"
    own = {name: d / f"{name}.key" for name, kind in programs if kind != "etcd"}
    return FleetKeys(opts.key_file, d / "application.key", d / "operators.keys", d / "nodes.keys", d / "inference.keys", own)


def tls_dir(opts: FleetOptions) -> Path:
    """Where `motor up --tls` writes its CA and certificates."""
    return opts.state_dir / "tls"


def _role_engines_log_to(cfg: dict[str, Any], log_dir: str) -> dict[str, Any]:
    """A nodemanager role section's ``engine`` replaces the whole top-level one; the fleet's
    engine log directory is kept there too (unless the section names its own)."""
    out = dict(cfg)
    for role in ("prefill", "decode", "union"):
        section = out.get(role)
        if isinstance(section, Mapping) and isinstance(section.get("engine"), Mapping):
            out[role] = {**section, "engine": {"log_dir": log_dir, **section["engine"]}}
    return out


def node_names(opts: FleetOptions) -> list[tuple[str, str]]:
    """(node name, role) for every node, e.g. ("prefill-0", "prefill")."""
    names: list[tuple[str, str]] = []
    for role, count in (("prefill", opts.prefill), ("decode", opts.decode), ("union", opts.union)):
        names += [(f"{role}-{i}", role) for i in range(count)]
    return names


def plan_fleet(opts: FleetOptions, bin_dir: Path) -> FleetPlan:
    """Every program of the fleet with its argv and configuration."""
    sd = opts.state_dir
    logs = sd / "logs"
    programs: list[ProgramSpec] = []

    def program(name: str, kind: Any, exe: str, config: dict[str, Any], port: int, role: str = "") -> None:
        merged = deep_merge(config, opts.overrides.get(kind, {}))
        if kind == "nodemanager":
            merged = _role_engines_log_to(merged, str(logs))
        cfg_path = sd / f"{name}.yaml"
        ports = sd / f"{name}.ports.json"
        argv = (str(bin_dir / exe), "--config", str(cfg_path), "--ports-file", str(ports))
        programs.append(ProgramSpec(name, kind, argv, merged, cfg_path, ports, port, role))

    def tls(name: str, *, mutual: bool = True) -> dict[str, Any]:
        """The `tls` section of program *name* (motor_common.tls.TlsConfig) under --tls."""
        d = tls_dir(opts)
        return {"cert_file": str(d / f"{name}.pem"), "key_file": str(d / f"{name}.key"),
                "ca_file": str(d / "ca.pem"), "require_client_cert": mutual}

    def server(port: int, name: str) -> dict[str, Any]:
        # metrics_port 0: the ops endpoint (/metrics, /health, /ready) on any free port, read back
        # from the program's ports file into fleet.json (`motor status` lists the URLs)
        auth: dict[str, Any] = {"operator_keys_file": str(keys.operators), "key_file": str(keys.own[name])}
        if name == "controller":
            auth["node_keys_file"] = str(keys.nodes)
        elif name.startswith("coordinator"):
            auth["inference_keys_file"] = str(keys.inference)
        section: dict[str, Any] = {"host": opts.host, "port": port, "auth": auth, "metrics_port": 0}
        if opts.tls:
            section["tls"] = tls(name)
        return section

    coord_names = ["coordinator" if len(opts.coordinator_ports) == 1 else f"coordinator-{i}"
                   for i in range(len(opts.coordinator_ports))]
    gateways = [] if opts.co_located else [("gateway", "gateway")]
    keys = fleet_keys(opts, [(n, "coordinator") for n in coord_names] + [("controller", "controller")]
                      + [(n, "nodemanager") for n, _ in node_names(opts)] + gateways)
    coord_addrs = [host_port(opts.host, p) for p in opts.coordinator_ports]
    for i, (name, port) in enumerate(zip(coord_names, opts.coordinator_ports, strict=True)):
        cfg: dict[str, Any] = {
            "server": server(port, name),
            "log": {"format": "text"},
        }
        if opts.kv_events:  # the simulated engines' tokenizer and block size (motor-sim's default 16)
            cfg["scheduler"] = {"policy": "kv_events", "kv_events": {"tokenizer": "simulator", "block_size": 16}}
        if opts.etcd_endpoint:  # active/standby: announce a promotion to the controller
            cfg["ha"] = {"etcd_endpoints": [opts.etcd_endpoint], "election_key": f"{HA_PREFIX}/coordinator/leader",
                         "advertise_address": coord_addrs[i]}  # fmt: skip
            cfg["controller_address"] = host_port(opts.host, opts.controller_port)
        if opts.co_located:  # the OpenAI front in this process, on the port the gateway would have used
            https = {k: v for k, v in tls(name, mutual=False).items() if k != "ca_file"} if opts.tls else None
            cfg["http"] = front_section(opts.host, opts.gateway_port, https, opts.front_workers)
        program(name, "coordinator", "motor-coordinator", cfg, port)

    store: dict[str, Any] = {"backend": "embedded", "path": str(sd / "controller.db")}
    controller_ha: dict[str, Any] = {}
    if opts.etcd_endpoint:  # controller state in etcd, behind the controller election
        store = {"backend": "etcd", "etcd_endpoints": [opts.etcd_endpoint], "etcd_prefix": f"{HA_PREFIX}/controller/"}
        controller_ha = {"ha": {"election_key": f"{HA_PREFIX}/controller-leader"}}

    program(
        "controller",
        "controller",
        "motor-controller",
        {
            "server": server(opts.controller_port, "controller"),
            "coordinators": coord_addrs,
            "heartbeat_interval_sec": opts.heartbeat_interval_sec,
            "heartbeat_timeout_sec": opts.heartbeat_timeout_sec,
            "store": store,
            "log": {"format": "text"},
            **controller_ha,
        },
        opts.controller_port,
    )

    sim_args = ["--sim-zero-latency"] if opts.zero_latency else []
    for (name, role), port in zip(node_names(opts), opts.node_ports, strict=True):
        program(
            name,
            "nodemanager",
            "motor-nodemanager",
            {
                "job_name": name,
                "node_id": name,
                "role": role,
                "engine_type": opts.engine,
                "model_name": opts.model,
                "ip": opts.host,
                "controller_address": host_port(opts.host, opts.controller_port),
                "server": server(port, name),
                "heartbeat_interval_seconds": opts.heartbeat_interval_sec,
                "daemon_loop_interval": 1.0,
                "health": {"poll_interval_sec": 0.5, "timeout_sec": 2.0, "startup_grace_sec": 60.0},
                "engine": {"launcher": "simulator", "extra_args": sim_args, "log_dir": str(logs),
                           **({"kv_events": {"enable": True}} if opts.kv_events else {})},
                "registration": {"backoff_base_sec": 0.5},
                "log": {"format": "text"},
            },
            port,
            role,
        )

    if opts.co_located:
        return FleetPlan(opts, tuple(programs), keys)
    gateway: dict[str, Any] = {"host": opts.host, "port": opts.gateway_port, "coordinators": coord_addrs,
                               "coordinator_key_file": str(keys.own["gateway"]), "log": {"format": "text"}}
    if opts.gateway_workers > 1:
        gateway["workers"] = opts.gateway_workers
    if opts.tls:
        gateway["tls"] = {k: v for k, v in tls("gateway").items() if k != "require_client_cert"}
        gateway["https"] = tls("gateway", mutual=False)
    program("gateway", "gateway", "motor-gateway", gateway, opts.gateway_port)
    return FleetPlan(opts, tuple(programs), keys)
