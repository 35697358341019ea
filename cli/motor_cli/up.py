"""motor up: run a whole Motor fleet on this machine.

  motor up                            # 1 prefill + 1 decode node, simulated vLLM engines
  motor up --prefill 2 --decode 1 --engine sglang
  motor up --co-located               # no gateway: the coordinator serves the OpenAI front itself
  motor up --co-located --front-workers 2   # that front as 2 worker processes on the one port
  motor up --config fleet.yaml        # per-program overrides, e.g. real engines on a GPU machine
  motor up --config fleet.yaml --dry-run   # validate the config and show what would run

Starts the coordinator, the controller, one nodemanager per node (each launches its engines) and
the gateway (none with --co-located: motor_cli.topology), shows progress while the engines come up, prints the gateway URL and a curl to paste,
then prints a status line whenever something changes. Like a kubelet, it restarts a program that
exits (a nodemanager that terminates itself for rescheduling comes back and re-registers); a
program that rejects its configuration (exit 2) is not restarted: motor up stops and says why.
Ctrl-C (or motor down, SIGTERM, or SIGHUP when its terminal closes) stops everything; every child
dies with this process, so nothing is left behind even after a SIGKILL. One fleet per state dir (--state-dir, default .motor/up).
On Ctrl-C every program gets SIGTERM and a grace longer than a nodemanager's engine stop timeout
(which escalates SIGTERM → SIGKILL on each engine's process group), then SIGKILL; finally every
descendant still running — including engines orphaned by a killed nodemanager, re-parented here
because motor up is a child subreaper — has its process group SIGKILLed, and "no process left
running" is printed only once none is left (leftovers.py). With --ha the local etcd is supervised
like the other programs (restarted when it exits).

The fleet config file (YAML/JSON) may hold the sections controller, coordinator, gateway and
nodemanager; each is deep-merged into that program's generated configuration and checked by the
program's own loader (unknown keys are rejected with a suggestion).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from motor_cli import arg_types, config_errors, statedir, target
from motor_cli.fleet import FleetOptions, FleetPlan, ProgramSpec, plan_fleet, tls_dir
from motor_cli.leftovers import become_subreaper, kill_leftovers, reap_adopted
from motor_cli.served_alone import served_alone
from motor_cli.status import FleetView, fetch_view, format_line
from motor_cli.topology import Topology
from motor_common.atomic_file import write_atomic
from motor_common.config import read_config_file
from motor_common.errors import ConfigError, FailedPrecondition, MotorError
from motor_common.ports import (
    CONTROLLER_GRPC,
    COORDINATOR_GRPC,
    GATEWAY_HTTP,
    NODEMANAGER_GRPC,
    free_port,
    host_port,
    port_free,
    port_in_use_message,
    scan_free_port,
)
from motor_common.procs import die_with_parent
from motor_common.runner import EXIT_CONFIG, EXIT_RESCHEDULE
from motor_common.tls import TlsConfig

EXIT_FAILED = 1
EXIT_INTERRUPTED = 130  # Ctrl-C before the fleet was ready
# Longest a starting motor up keeps other motor ups from picking ports (a program that never binds).
PORT_PICK_HOLD_SEC = 30.0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prefill", type=int, default=1, help="prefill nodes (default 1)")
    parser.add_argument("--decode", type=int, default=1, help="decode nodes (default 1)")
    parser.add_argument("--union", type=int, default=0, help="union (non-PD) nodes (default 0)")
    parser.add_argument("--engine", choices=["vllm", "sglang"], default="vllm", help="engine protocol (default vllm)")
    parser.add_argument("--model", default="tiny", help="served model name (default tiny)")
    parser.add_argument("--host", default="127.0.0.1", help="address every program listens on")
    parser.add_argument("--port", type=arg_types.port, default=None,
                        help="OpenAI front port: the gateway's, or the coordinator's with --co-located "
                             "(default 8000, or a free one if busy)")
    parser.add_argument("--co-located", action="store_true",
                        help="no gateway: the coordinator serves the OpenAI front itself, on --port "
                             "(less CPU per request; not with --ha or --gateway-workers; docs/coordinator.md)")
    parser.add_argument("--front-workers", type=int, default=None, metavar="N",
                        help="with --co-located: the coordinator's OpenAI front as N worker processes on the one "
                             "port, each dispatching itself (1-64, default 1; docs/operations.md)")
    parser.add_argument("--gateway-workers", type=int, default=1, metavar="N",
                        help="gateway worker processes on the one port, supervised; the coordinator stays one "
                             "process (default 1; not with --co-located; docs/operations.md)")
    parser.add_argument("--state-dir", default=".motor/up", help="configs, logs, store and key (default .motor/up)")
    parser.add_argument("--config", help="fleet config file with per-program sections")
    parser.add_argument("--zero-latency", action="store_true", help="simulated engines answer instantly")
    parser.add_argument("--kv-events", action="store_true",
                        help="engines publish KV-cache events; the coordinator routes prefill by them (docs/kv-events.md)")
    parser.add_argument("--ha", action="store_true", help="two coordinators, active/standby through a local etcd")
    parser.add_argument("--restart-delay", type=arg_types.seconds(above=False), default=2.0, help="seconds before a program that exited is restarted")
    parser.add_argument("--timeout", type=arg_types.seconds(), default=180.0, help="seconds to wait for the fleet to be ready")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (programs and configs) and exit")
    parser.add_argument("--tls", action="store_true",
                        help="mutual TLS on every gRPC channel and HTTPS on the gateway, with a throw-away CA "
                             "and per-program certificates in STATE_DIR/tls")




def _pick(host: str, wanted: int | None, default: int, what: str, taken: set[int]) -> int:
    """*wanted* (checked free), else the first free port from *default* up outside the kernel's
    ephemeral range (so no engine's or test's free-port pick can take it before the program binds)."""
    if wanted:
        if not port_free(host, wanted):
            raise ConfigError(f"{what} {port_in_use_message(wanted, 'pass another --port or free it')}")
        port = wanted
    else:
        port = scan_free_port(host, default, taken)
    taken.add(port)
    return port


def build_options(args: argparse.Namespace, claimed: frozenset[int] = frozenset()) -> FleetOptions:
    """The fleet's options from the command line; ports picked free and outside *claimed* (the
    ports other running ``motor up`` serve on: :class:`statedir.PortClaims`)."""
    state = Path(args.state_dir)
    overrides: dict[str, Any] = read_config_file(args.config) if args.config else {}
    overrides = {name: {} if section is None else section for name, section in overrides.items()}  # `coordinator:`
    host = args.host
    taken: set[int] = set(claimed)
    gateway = _pick(host, args.port, GATEWAY_HTTP, Topology(args.co_located).front_label, taken)
    coordinators = tuple(_pick(host, None, COORDINATOR_GRPC, "coordinator", taken) for _ in range(2 if args.ha else 1))
    controller = _pick(host, None, CONTROLLER_GRPC, "controller", taken)
    nodes = args.prefill + args.decode + args.union
    return FleetOptions(
        prefill=args.prefill,
        decode=args.decode,
        union=args.union,
        engine=args.engine,
        model=args.model,
        host=host,
        gateway_port=gateway,
        gateway_workers=args.gateway_workers,
        front_workers=args.front_workers,
        coordinator_ports=coordinators,
        controller_port=controller,
        node_ports=tuple(_pick(host, None, NODEMANAGER_GRPC, "nodemanager", taken) for _ in range(nodes)),
        state_dir=state,
        key_file=state / "keys" / "operator.key",
        zero_latency=args.zero_latency,
        kv_events=args.kv_events,
        overrides=overrides,
        tls=args.tls,
        co_located=args.co_located,
    )


# SIGTERM → SIGKILL grace of every program on stop: longer than a nodemanager's default engine
# stop timeout (10 s), so nodemanagers finish their own SIGTERM → SIGKILL of the engines first.
STOP_GRACE_SEC = 15.0


@dataclass
class Child:
    spec: ProgramSpec
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    restart_at: float | None = None
    last_exit: int | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None


@dataclass
class Supervisor:
    """Starts programs, restarts those that exit, stops them all in reverse order."""

    restart_delay: float
    children: list[Child] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    stopping: bool = False
    # Programs that exited with EXIT_CONFIG: they cannot start as configured, so never restarted.
    fatal: list[Child] = field(default_factory=list)

    def start(self, child: Child) -> None:
        child.log_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            child.spec.ports_file.unlink()
        out = open(child.log_path, "ab")
        try:
            child.proc = subprocess.Popen(
                die_with_parent(child.spec.argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            out.close()
        child.starts += 1
        child.restart_at = None
        if child not in self.children:
            self.children.append(child)

    def tracked(self) -> set[int]:
        return {c.proc.pid for c in self.children if c.proc is not None}

    def poll(self) -> None:
        """Notice exits and restart programs whose delay has passed (level-triggered)."""
        reap_adopted(self.tracked())  # orphans re-parented to us (child subreaper)
        now = time.monotonic()
        for child in self.children:
            if child.proc is not None and child.restart_at is None:
                code = child.proc.poll()
                if code is not None:
                    child.last_exit = code
                    child.proc = None
                    why = "to be rescheduled" if code == EXIT_RESCHEDULE else f"with code {code}"
                    if self.stopping:
                        continue
                    if code == EXIT_CONFIG:
                        self.fatal.append(child)
                        self.events.append(f"{child.spec.name} exited with code {code} (it cannot start as "
                                           f"configured); not restarting it (log: {child.log_path})")
                        continue
                    child.restart_at = now + self.restart_delay
                    self.events.append(
                        f"{child.spec.name} exited {why}; restarting in {self.restart_delay:g} s "
                        f"(log: {child.log_path})"
                    )
            elif child.proc is None and child.restart_at is not None and now >= child.restart_at and not self.stopping:
                self.start(child)
                self.events.append(f"{child.spec.name} restarted (pid {child.pid})")

    async def stop_all(self, grace: float = STOP_GRACE_SEC) -> None:
        self.stopping = True
        for child in reversed(self.children):
            if child.proc is not None and child.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in self.children:
            if child.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(child.proc.wait, max(0.0, deadline - time.monotonic()))
        for child in self.children:
            if child.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.proc.wait(5)
                child.proc = None


def _write_configs(plan: FleetPlan) -> None:
    opts = plan.options
    opts.state_dir.mkdir(parents=True, exist_ok=True)
    _write_keys(plan)
    if opts.tls:
        _write_certificates(plan)
    for spec in plan.programs:
        spec.config_path.write_text(yaml.safe_dump(dict(spec.config), sort_keys=False))


def _secret_file(path: Path, text: str) -> None:
    """*text* into *path*, readable by this user only, atomically: a crash leaves the old file or
    the new one, never half a key, and a symlink at *path* is replaced, not written through."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomic(path, text)  # mode 0600


def _holds_key(path: Path) -> bool:
    return path.is_file() and bool(path.read_text(errors="replace").strip())


def _write_keys(plan: FleetPlan) -> None:
    """One key per program and one for the operator (kept across runs), and the named key files
    each program accepts (rewritten from them): see motor_cli.fleet.FleetKeys."""
    keys = plan.keys
    for path in (keys.operator, keys.application, *keys.own.values()):
        if not _holds_key(path):  # none yet, or left empty by a crash of an older motor up
            _secret_file(path, secrets.token_hex(24) + "\n")

    def listing(named: dict[str, Path]) -> str:
        return "".join(f"{name}: {path.read_text().strip()}\n" for name, path in named.items())

    _secret_file(keys.operators, listing({"operator": keys.operator, **keys.named("operators")}))
    _secret_file(keys.nodes, listing(keys.named("nodes")))
    _secret_file(keys.inference, listing({"application": keys.application, **keys.named("inference")}))


def _write_certificates(plan: FleetPlan) -> None:
    """A fresh throw-away CA and one certificate per program (and `cli`) for this run."""
    from motor_common import certs  # cryptography: only needed with --tls

    d = tls_dir(plan.options)
    hosts = sorted({plan.options.host, "127.0.0.1", "localhost"})
    ca = certs.make_ca(d)
    for name in plan.tls_names:
        certs.issue(ca, d, name, hosts)


def cli_tls(plan: FleetPlan) -> TlsConfig | None:
    """The CLI's own TLS identity in a --tls fleet (for status polling and fleet.json)."""
    if not plan.options.tls:
        return None
    d = tls_dir(plan.options)
    return TlsConfig(cert_file=str((d / "cli.pem").resolve()), key_file=str((d / "cli.key").resolve()),
                     ca_file=str((d / "ca.pem").resolve()))


def _client_ssl(tls: TlsConfig | None) -> ssl.SSLContext | bool:
    """What aiohttp needs to reach the gateway: the fleet CA under --tls, else plain HTTP."""
    if tls is None or tls.ca_file is None:
        return True
    return ssl.create_default_context(cafile=tls.ca_file)


def _ops_url(plan: FleetPlan, spec: ProgramSpec) -> str | None:
    """Where program *spec* serves /metrics, /health and /ready: the gateway on its own port, the
    gRPC programs on the ops port their ports file names (None until it is written)."""
    if not spec.writes_ports_file:
        return None
    if spec.kind == "gateway":
        return plan.gateway_url
    try:
        port = json.loads(spec.ports_file.read_text()).get("metrics")
    except (OSError, ValueError, AttributeError):
        return None
    # HTTPS with the program's certificate under --tls (server.ops_tls "auto"), unless overridden
    ops_tls = spec.config.get("server", {}).get("ops_tls", "auto")
    scheme = "https" if plan.options.tls and ops_tls != "plaintext" else "http"
    return f"{scheme}://{host_port(plan.options.host, port)}" if isinstance(port, int) else None


def _write_fleet_file(plan: FleetPlan, sup: Supervisor, ready: bool) -> None:
    opts = plan.options
    data = {
        "pid": os.getpid(),
        "started": target.started_at(os.getpid()),  # with the pid: this process, not a reuse of its pid
        "ready": ready,
        "gateway_url": plan.gateway_url,  # the OpenAI front, whichever program serves it
        "topology": {"name": plan.topology.name, "front": plan.topology.front_program,
                     "description": plan.topology.description, "workers": plan.front_workers},
        "controller": plan.controller_address,
        "coordinators": plan.coordinator_addresses,
        "management_key_file": str(opts.key_file.resolve()),  # the operator's key (the CLI's)
        "inference_key_file": str(plan.keys.application.resolve()),  # DispatchService (gRPC) callers
        "keys": {name: str(path.resolve()) for name, path in plan.keys.own.items()},  # each program's own
        "tls": dataclasses.asdict(tls) if (tls := cli_tls(plan)) else None,
        "model": opts.model,
        "programs": {c.spec.name: {"pid": c.pid, "port": c.spec.port, "kind": c.spec.kind, "role": c.spec.role,
                                    "starts": c.starts, "log": str(c.log_path),
                                    "ops_url": _ops_url(plan, c.spec)} for c in sup.children},
    }
    tmp = opts.state_dir / "fleet.json.tmp"
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(opts.state_dir / "fleet.json")


def _tail(path: Path, lines: int = 8) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


async def _gateway_ready(session: aiohttp.ClientSession, url: str,
                         tls: TlsConfig | None = None) -> tuple[bool, str]:
    """(ready, reason) from the gateway's readiness route ``/ready`` (``/health`` on a gateway
    without one, where it was readiness); the reason from the 503 body ``{"status","reason"}`` (or
    an OpenAI-style ``{"error": {"message"}}``)."""
    try:
        for route in ("/ready", "/health"):
            async with session.get(f"{url}{route}", timeout=aiohttp.ClientTimeout(total=2),
                                   ssl=_client_ssl(tls)) as resp:
                if resp.status == 404 and route == "/ready":
                    continue
                body = await resp.json(content_type=None)
                return resp.status == 200, _reason(body) or f"HTTP {resp.status}"
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        return False, f"unreachable ({type(exc).__name__})"
    return False, "no readiness route"


def _reason(body: Any) -> str:
    if not isinstance(body, dict):
        return ""
    error = body.get("error")
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return str(body.get("reason") or "")


def _say(text: str) -> None:
    print(text, flush=True)


def _engine_kind(plan: FleetPlan) -> str:
    launchers = {str(p.config.get("engine", {}).get("launcher", "")) for p in plan.of_kind("nodemanager")}
    return "simulated" if launchers <= {"simulator"} else "native " + "/".join(sorted(launchers - {"simulator"}))


def _banner(plan: FleetPlan) -> str:
    o = plan.options
    nodes = ", ".join(f"{n} {r}" for r, n in (("prefill", o.prefill), ("decode", o.decode), ("union", o.union)) if n)
    url = plan.gateway_url
    body = json.dumps({"model": o.model, "prompt": "Hello, Motor", "max_tokens": 16})
    coord = plan.coordinator_addresses[0]
    curl, grpcurl = "curl", "-plaintext"
    if o.tls:
        d = tls_dir(o)
        curl = f"curl --cacert {d}/ca.pem"
        grpcurl = f"-cacert {d}/ca.pem -cert {d}/cli.pem -key {d}/cli.key"
    return "\n".join(
        [
            "",
            f"Motor is up: {nodes} ({o.engine} protocol, {_engine_kind(plan)} engines)",
            f"  OpenAI front {url}/v1  (served by the coordinator; no gateway)" if o.co_located else
            f"  gateway      {url}/v1",
            f"  coordinator  {', '.join(plan.coordinator_addresses)}",
            f"  controller   {plan.controller_address}",
            f"  state        {o.state_dir}  (configs, logs/, keys/, controller.db)",
            "",
            "Try:",
            f"  {curl} -s {url}/v1/completions -H 'Content-Type: application/json' -d '{body}'",
            f"  {curl} -sN {url}/v1/chat/completions -H 'Content-Type: application/json' "
            f"-d '{json.dumps({'model': o.model, 'messages': [{'role': 'user', 'content': 'Hi'}], 'stream': True})}'",
            f"  .venv/bin/motor status --state-dir {o.state_dir}",
            f"  .venv/bin/grpcurl {grpcurl} {coord} list",
            "",
            "Ctrl-C stops everything.",
            "",
        ]
    )


async def _run(plan: FleetPlan, restart_delay: float, timeout: float, user_file: str | None = None,
               picking: statedir.PortPickLock | None = None, etcd: tuple[ProgramSpec, str] | None = None) -> int:
    """Run the fleet until Ctrl-C; *etcd* = (its program spec, health URL) for ``--ha``: started
    first, supervised like the others, stopped last."""
    opts = plan.options
    _write_configs(plan)
    become_subreaper()
    sup = Supervisor(restart_delay)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # SIGHUP: the terminal of motor up closed (an ssh session dropped); stop like Ctrl-C, not die
    # before stopping the programs and proving none is left.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    logs = opts.state_dir / "logs"
    order = [*plan.of_kind("coordinator"), *plan.of_kind("controller"), *plan.of_kind("nodemanager"), *plan.of_kind("gateway")]
    _say(f"Starting Motor in {opts.state_dir} (logs in {logs}/)")
    key = opts.key_file.read_text().strip()
    try:
        if etcd is not None:
            spec, health = etcd
            child = Child(spec, logs / "etcd.log")
            sup.start(child)
            _say(f"  started etcd           pid {child.pid:<7} port {spec.port}")
            assert child.proc is not None
            if not await _etcd_healthy(health, child.proc, 20.0):
                _say(f"error: etcd did not become healthy; see {child.log_path}\n{_tail(child.log_path)}")
                return EXIT_FAILED
        for spec in order:
            child = Child(spec, logs / f"{spec.name}.log")
            sup.start(child)
            workers = f", {plan.front_workers} worker processes" if plan.front_workers > 1 else ""
            front = f" (OpenAI front on {opts.gateway_port}{workers})" if opts.co_located and spec.kind == "coordinator" else ""
            _say(f"  started {spec.name:<14} pid {child.pid:<7} port {spec.port}{front}")
        _write_fleet_file(plan, sup, ready=False)
        async with aiohttp.ClientSession() as http:
            ready = await _wait_ready(plan, sup, http, key, stop, timeout, picking)
            if not ready:
                if sup.fatal:
                    return _fatal(plan, sup, user_file)
                return EXIT_INTERRUPTED if stop.is_set() else EXIT_FAILED
            _write_fleet_file(plan, sup, ready=True)
            _say(_banner(plan))
            await _watch(plan, sup, http, key, stop)
        return _fatal(plan, sup, user_file) if sup.fatal else 0
    finally:
        _say("\nStopping Motor…")
        await sup.stop_all()
        killed, still = await kill_leftovers(sup.tracked())
        with contextlib.suppress(FileNotFoundError):
            (opts.state_dir / "fleet.json").unlink()
        if killed:
            _say(f"  killed {len(killed)} process(es) that outlived their program: " + "; ".join(killed))
        if still:
            _say("error: still running after SIGKILL: " + "; ".join(still))
        else:
            _say("Stopped; no process left running.")


async def _wait_ready(
    plan: FleetPlan, sup: Supervisor, http: aiohttp.ClientSession, key: str, stop: asyncio.Event, timeout: float,
    picking: statedir.PortPickLock | None = None,
) -> bool:
    started = time.monotonic()
    deadline = started + timeout
    last = ""
    while not stop.is_set():
        sup.poll()
        # Every program that writes a ports file has written it, or has exited.
        bound = all(not c.spec.writes_ports_file or c.spec.ports_file.exists() or c.proc is None
                    for c in sup.children)
        if picking is not None and (bound or time.monotonic() > started + PORT_PICK_HOLD_SEC):
            picking.release()  # every program holds its port (or has exited): another motor up may pick
        for event in sup.events:
            _say(f"  ! {event}")
            child = next((c for c in sup.children if event.startswith(c.spec.name + " exited")), None)
            if child is not None:
                tail = _tail(child.log_path)
                if tail:
                    _say("    " + tail.replace("\n", "\n    "))
        sup.events.clear()
        view = await fetch_view(plan.controller_address, key, tls=cli_tls(plan))
        ok, why = await _gateway_ready(http, plan.gateway_url, cli_tls(plan))
        fleet = format_line(view) if view.ok else "controller starting"
        all_up = ok and bound and view.ok and view.active == view.expected(plan.options.node_count)
        # Every instance active in the controller's view, and pushed to the coordinators: no model
        # answered by one side of its pair alone (a coordinator is ready with one side already).
        alone = await served_alone(plan.coordinator_addresses, cli_tls(plan)) if all_up else []
        line = f"  waiting: {fleet}; {plan.topology.front_label} {'ready' if ok else 'not ready: ' + why}"
        if alone:
            line += "; served alone: " + ", ".join(alone)
        if line != last:
            _say(line)
            last = line
        if sup.fatal:
            return False
        # Ready once every program has also finished starting (its ports file is written last): the
        # co-located front can answer from its workers before the coordinator's start returns.
        if all_up and not alone:
            return True
        if time.monotonic() > deadline:
            _say(f"error: the fleet was not ready after {timeout:g} s; see the logs in {plan.options.state_dir}/logs")
            return False
        with contextlib.suppress(asyncio.TimeoutError):
            async with asyncio.timeout(0.5):
                await stop.wait()
    return False


async def _watch(plan: FleetPlan, sup: Supervisor, http: aiohttp.ClientSession, key: str, stop: asyncio.Event) -> None:
    last = ""
    last_print = time.monotonic()
    while not stop.is_set() and not sup.fatal:
        sup.poll()
        for event in sup.events:
            _say(f"[{time.strftime('%H:%M:%S')}] {event}")
        if sup.events:
            _write_fleet_file(plan, sup, ready=True)
        sup.events.clear()
        view: FleetView = await fetch_view(plan.controller_address, key, tls=cli_tls(plan))
        ok, why = await _gateway_ready(http, plan.gateway_url, cli_tls(plan))
        line = f"{format_line(view)}; {plan.topology.front_label} {'ready' if ok else 'NOT ready: ' + why}"
        alone = await served_alone(plan.coordinator_addresses, cli_tls(plan)) if ok else []
        if alone:
            line += "; DEGRADED, served alone: " + ", ".join(alone)
        if line != last or time.monotonic() - last_print > 60:
            _say(f"[{time.strftime('%H:%M:%S')}] {line}")
            last, last_print = line, time.monotonic()
        with contextlib.suppress(asyncio.TimeoutError):
            async with asyncio.timeout(1.0):
                await stop.wait()


def _fatal(plan: FleetPlan, sup: Supervisor, user_file: str | None) -> int:
    """Say why a program could not start (its own error, in terms of the operator's --config file
    when the offending key came from it) and that motor up stopped; the exit code is 2."""
    child = sup.fatal[0]
    own = config_errors.error_line(_tail(child.log_path, 40))
    overrides = plan.options.overrides.get(child.spec.kind, {})
    message = config_errors.explain(own, child.spec.kind, str(child.spec.config_path), user_file, overrides)
    print(f"error: {message or 'see its log'}", file=sys.stderr, flush=True)
    fix = f"fix {user_file} and " if user_file and message.startswith(f"{user_file}:") else ""
    print(f"motor up stopped: the {child.spec.name} cannot start as configured (exit {EXIT_CONFIG}) and is not "
          f"restarted; {fix}run motor up again (log: {child.log_path})", file=sys.stderr, flush=True)
    return EXIT_CONFIG


# Every program checks its configuration at once, in parallel (a check takes about a second).
CHECK_CONFIG_TIMEOUT_SEC = 60.0


def _check_configs(plan: FleetPlan, user_file: str | None) -> list[str]:
    """Every program's configuration checked by the program itself (``--check-config``, its own
    loader), all at once; the errors, in terms of *user_file* where they come from it."""
    with tempfile.TemporaryDirectory(prefix="motor-up-check-") as tmp:
        procs = []
        for spec in plan.programs:
            path = Path(tmp) / spec.config_path.name
            path.write_text(yaml.safe_dump(dict(spec.config), sort_keys=False))
            procs.append((spec, path, subprocess.Popen(
                [spec.argv[0], "--config", str(path), "--check-config"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
        errors = []
        deadline = time.monotonic() + CHECK_CONFIG_TIMEOUT_SEC
        for spec, path, proc in procs:
            try:
                _, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                errors.append(f"the {spec.name} did not finish checking its configuration within "
                              f"{CHECK_CONFIG_TIMEOUT_SEC:g} s (killed)")  # fmt: skip
                continue
            if proc.returncode != 0:
                own = config_errors.error_line(err) or err.strip() or f"exit {proc.returncode}"
                overrides = plan.options.overrides.get(spec.kind, {})
                explained = config_errors.explain(own, spec.kind, str(path), user_file, overrides)
                errors.append(explained.replace(str(path), str(spec.config_path)))
    return errors


def _dry_run(plan: FleetPlan, user_file: str | None, extra: str = "") -> int:
    print(f"# topology: {plan.topology.description}")
    if extra:
        print(extra)
    for spec in plan.programs:
        print(f"# {spec.name}: {' '.join(spec.argv)}")
        print(yaml.safe_dump(dict(spec.config), sort_keys=False))
    errors = _check_configs(plan, user_file)
    for error in dict.fromkeys(errors):  # one line per distinct error (nodemanagers share sections)
        print(f"error: {error}", file=sys.stderr)
    if errors:
        return EXIT_CONFIG
    print(f"# every program accepted its configuration ({len(plan.programs)} checked with --check-config)")
    return 0


def run(args: argparse.Namespace) -> int:
    picking = statedir.PortPickLock()
    claims = statedir.PortClaims()
    try:
        if not args.dry_run:
            picking.acquire()
        opts = build_options(args, frozenset(claims.claimed()))
        if not args.dry_run:  # until motor up exits, restarts included: no other motor up picks these
            claims.claim(_fleet_ports(opts))
        if args.dry_run:
            if args.ha:
                plan, etcd = _ha_plan(opts)
                return _dry_run(plan, args.config, f"# etcd: {' '.join(etcd.argv(opts.state_dir / 'etcd-XXXX'))}")
            return _dry_run(plan_fleet(opts, Path(sys.executable).parent), args.config)
        with statedir.exclusive(opts.state_dir):
            statedir.check_format(opts.state_dir)
            statedir.write_format(opts.state_dir)
            if args.ha:
                plan, etcd = _ha_plan(opts)
                return asyncio.run(_run_with_etcd(plan, etcd, args.restart_delay, args.timeout, args.config,
                                                  picking))
            plan = plan_fleet(opts, Path(sys.executable).parent)
            return asyncio.run(_run(plan, args.restart_delay, args.timeout, args.config, picking))
    except FailedPrecondition as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    except (ConfigError, MotorError) as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_CONFIG
    except OSError as exc:  # e.g. the state dir (its files, keys, logs) cannot be made or written
        print(f"error: {_os_error(exc, Path(args.state_dir))}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        picking.release()
        claims.release()


def _os_error(exc: OSError, state_dir: Path) -> str:
    """*exc* in one sentence; for a file of *state_dir*, what to do."""
    if not exc.filename:
        return str(exc)
    path = Path(os.fsdecode(exc.filename))
    inside = path.absolute() == state_dir.absolute() or state_dir.absolute() in path.absolute().parents
    hint = "; pass another --state-dir (or fix that one)" if inside else ""
    return f"{path}: {exc.strerror or exc}{hint}"


def _fleet_ports(opts: FleetOptions) -> list[int]:
    """The ports the fleet's programs serve on (each program rebinds its own when restarted)."""
    return [opts.gateway_port, *opts.coordinator_ports, opts.controller_port, *opts.node_ports]


ETCD_BINARY = "/usr/bin/etcd"


def etcd_binary() -> str:
    """The etcd server binary (Debian ``etcd-server``), or a ConfigError saying how to get it."""
    found = shutil.which("etcd") or (ETCD_BINARY if os.access(ETCD_BINARY, os.X_OK) else None)
    if found is None:
        raise ConfigError("--ha needs the etcd server binary (etcd), which was not found: install it with "
                          "scripts/setup --tools (Debian package etcd-server)")
    return found


def etcd_argv(binary: str, host: str, client_port: int, peer_port: int, data_dir: Path) -> list[str]:
    """A single-member etcd on loopback ports, data in *data_dir*."""
    client, peer = f"http://{host}:{client_port}", f"http://{host}:{peer_port}"
    return [binary, "--name", "motor-up", "--data-dir", str(data_dir),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"motor-up={peer}", "--log-level", "warn"]  # fmt: skip


@dataclass(frozen=True)
class LocalEtcd:
    binary: str
    host: str
    client_port: int
    peer_port: int

    def argv(self, data_dir: Path) -> list[str]:
        return etcd_argv(self.binary, self.host, self.client_port, self.peer_port, data_dir)


def _ha_plan(opts: FleetOptions) -> tuple[FleetPlan, LocalEtcd]:
    """``--ha``: a local etcd (temp data dir under the state dir), two coordinators active/standby,
    the controller on the etcd store (controller election), the gateway knowing both coordinators."""
    binary = etcd_binary()
    host = "127.0.0.1" if ":" not in opts.host else "::1"  # etcd stays on loopback
    etcd = LocalEtcd(binary, host, free_port(host), free_port(host))
    client = etcd.client_port
    opts = replace(opts, etcd_endpoint=f"{host}:{client}" if ":" not in host else f"[{host}]:{client}")
    return plan_fleet(opts, Path(sys.executable).parent), etcd


async def _run_with_etcd(
    plan: FleetPlan, etcd: LocalEtcd, restart_delay: float, timeout: float, user_file: str | None,
    picking: statedir.PortPickLock | None = None,
) -> int:
    opts = plan.options
    client_port = etcd.client_port
    opts.state_dir.mkdir(parents=True, exist_ok=True)
    (opts.state_dir / "logs").mkdir(exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="etcd-", dir=opts.state_dir))
    spec = ProgramSpec("etcd", "etcd", tuple(etcd.argv(data_dir)), {},
                       opts.state_dir / "etcd.unused", opts.state_dir / "etcd.ports", client_port)
    try:
        return await _run(plan, restart_delay, timeout, user_file, picking,
                          etcd=(spec, f"http://{opts.etcd_endpoint}/health"))
    finally:
        await asyncio.to_thread(shutil.rmtree, data_dir, True)


async def _etcd_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(TimeoutError, aiohttp.ClientError, ValueError):
                async with http.get(url, timeout=aiohttp.ClientTimeout(total=1)) as resp:
                    if resp.status == 200 and (await resp.json(content_type=None)).get("health") == "true":
                        return True
            await asyncio.sleep(0.1)
    return False
