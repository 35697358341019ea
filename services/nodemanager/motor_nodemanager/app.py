"""The application base: ordered module start/stop, signals, ``stop`` on stdin, the daemon loop and
config hot-reload propagation.

:class:`Application` knows nothing about nodemanagers. :class:`NodeManagerApp` composes the modules in
the SPEC start order: signals → config → logging → ports → API server → register → (config watcher
unless snapshot mode) → daemon loop. Modules stop in reverse order.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import stat
from collections.abc import Mapping
from typing import Protocol

import orjson

from motor_common.config import to_dict
from motor_common.credentials import Credential, presented_key
from motor_common.domain import Endpoint
from motor_common.errors import ConfigError, MotorError
from motor_common.grpc_server import GrpcServer, read_secret
from motor_common.logs import setup_logging
from motor_common.ops_http import OpsHttpServer, ops_server
from motor_common.ports import engine_port_picker
from motor_common.runner import EXIT_RESCHEDULE, write_ports_file
from motor_common.stall_clock import StallCompensatedClock, lag_monitor
from motor_common.tasks import TaskOwner
from motor_nodemanager import config as nmconfig
from motor_nodemanager.config import NodeManagerConfig
from motor_nodemanager.controller_client import ControllerPeer, FaultLevel, GrpcController
from motor_nodemanager.deaths import DeathReporter
from motor_nodemanager.fault_reporter import FaultReporter
from motor_nodemanager.heartbeat import HeartbeatSender
from motor_nodemanager.node import Node
from motor_nodemanager.ports import plan_endpoints, ports_of
from motor_nodemanager.registration import RegistrationFailed, register_with_retry
from motor_nodemanager.servicer import add_services
from motor_nodemanager.services import KV_CACHE_STORE, KvStoreWorker, plan_services
from motor_nodemanager.snapshot import CHECKPOINT_SIGNAL, RESTORE_SIGNAL, load_metadata

log = logging.getLogger(__name__)


class Module(Protocol):
    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def on_config_change(self, new: NodeManagerConfig) -> None: ...


class Application:
    """Runs modules in order, a daemon loop, and stops them in reverse on any exit request."""

    name = "app"

    def __init__(self) -> None:
        self.modules: list[Module] = []
        self.exit_code = 0
        self._stop = asyncio.Event()
        self._started: list[Module] = []
        self.daemon_interval = 5.0

    def request_exit(self, code: int, reason: str) -> None:
        if not self._stop.is_set():
            log.warning("exiting: %s", reason, extra={"exit_code": code})
            self.exit_code = code
            self._stop.set()

    @property
    def exiting(self) -> bool:
        return self._stop.is_set()

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_exit, 0, f"signal {signal.Signals(sig).name}")
        try:
            mode = os.fstat(0).st_mode
        except OSError:
            return
        if os.isatty(0) or stat.S_ISFIFO(mode):
            buf = bytearray()

            def on_stdin() -> None:
                try:
                    chunk = os.read(0, 4096)
                except OSError:
                    chunk = b""
                if not chunk:
                    loop.remove_reader(0)
                    return
                buf.extend(chunk)
                while b"\n" in buf:
                    line, _, rest = bytes(buf).partition(b"\n")
                    buf[:] = rest
                    if line.strip() == b"stop":
                        self.request_exit(0, "'stop' on stdin")

            with contextlib.suppress(OSError, NotImplementedError, ValueError):
                loop.add_reader(0, on_stdin)
        self.install_extra_signals(loop)

    def install_extra_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        """More signal handlers (subclasses)."""

    async def setup(self) -> None:
        """Load configuration and logging, build the modules (subclasses)."""

    async def tick(self) -> None:
        """One daemon-loop iteration (subclasses)."""

    async def run(self) -> int:
        self._install_signals()
        await self.setup()
        try:
            for module in self.modules:
                if self.exiting:
                    break
                await module.start()
                self._started.append(module)
            while not self.exiting:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.daemon_interval):
                        await self._stop.wait()
                if not self.exiting:
                    await self.tick()
        finally:
            for module in reversed(self._started):
                log.info("stopping module %s", module.name)
                try:
                    await module.stop()
                except Exception:
                    log.exception("module %s failed to stop", module.name)
        return self.exit_code

    def propagate_config(self, new: NodeManagerConfig) -> None:
        for module in self._started:
            try:
                module.on_config_change(new)
            except Exception:
                log.exception("module %s rejected the configuration change", module.name)


# --- modules of the nodemanager ------------------------------------------------------------------
class _Base:
    name = "module"

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def on_config_change(self, new: NodeManagerConfig) -> None:
        pass


class EnginesModule(_Base):
    """Owns the engine processes: started first, stopped last (no orphan keeps a port). Also feeds
    the node's stall-compensated clock (health-probe timeouts and node timers count only time this
    process was running: a starved nodemanager does not relaunch healthy engines)."""

    name = "engines"

    def __init__(self, node: Node, clock: StallCompensatedClock) -> None:
        self.node = node
        self.clock = clock
        self._tasks = TaskOwner("engines-module")

    async def start(self) -> None:
        self._tasks.spawn(lag_monitor(self.clock, log, "engine health probes and node timers"), name="lag-monitor")

    async def stop(self) -> None:
        try:
            await self.node.stop_engines()
        finally:
            await self._tasks.close()

    def on_config_change(self, new: NodeManagerConfig) -> None:
        self.node.arbiter.threshold = new.health.abnormal_threshold
        if self.node.fault_reporter is not None and self.node.command is not None and not self.node.relaunching:
            self.node.fault_reporter.resume(reset=False)  # fault-tolerance switch / port: rebuild sockets


class KvStoreModule(_Base):
    """The KV-cache store service: started before the engines, stopped after them."""

    name = "kv-cache-store"

    def __init__(self, node: Node, worker: KvStoreWorker) -> None:
        self.node = node
        self.worker = worker

    async def start(self) -> None:
        await self.worker.start()
        self.node.kv_store = self.worker

    async def stop(self) -> None:
        await self.worker.stop()


class ApiServerModule(_Base):
    name = "api-server"

    def __init__(self, app: NodeManagerApp) -> None:
        self.app = app
        self.server: GrpcServer | None = None
        self.ops: OpsHttpServer | None = None

    async def _ready(self) -> tuple[bool, str]:
        return self.app.node.readiness()

    async def start(self) -> None:
        cfg = self.app.config
        server = GrpcServer("nodemanager", cfg.server)
        add_services(server, self.app.node, self.app.stop_node, cfg)
        port = await server.start()
        self.server = server
        self.app.admin_port = port
        self.app.node.node_id = default_node_id(cfg, os.environ, socket.gethostname())
        self.app.node.state_prefix = self.app.node.node_id
        self.app.node.load_recorded()  # engines a killed predecessor left running (before the plan is announced)
        self.ops = ops_server(cfg.server, self._ready)
        if self.ops is not None:
            await self.ops.start()
        self.app.avoid_own_listeners({port, self.ops.port if self.ops else 0} - {0})
        if self.app.ports_file:
            write_ports_file(self.app.ports_file, {"grpc": port, "metrics": self.ops.port if self.ops else None})

    async def stop(self) -> None:
        if self.ops is not None:
            await self.ops.stop()
        if self.server is not None:
            await self.server.set_serving(False)
            await self.server.stop(1.0)

    def on_config_change(self, new: NodeManagerConfig) -> None:
        if new.server != self.app.config.server:
            log.warning("server listen address/port/TLS changed: needs a restart to take effect")


class RegistrationModule(_Base):
    name = "registration"

    def __init__(self, app: NodeManagerApp) -> None:
        self.app = app

    async def start(self) -> None:
        await self.app.register(first=True)


class HeartbeatModule(_Base):
    name = "heartbeat"

    def __init__(self, app: NodeManagerApp, peer: ControllerPeer) -> None:
        self.app = app
        node = app.node
        self.sender = HeartbeatSender(
            peer,
            node.heartbeat_frame,
            lambda: app.config.heartbeat_interval_seconds,
            lambda: app.register(first=False),
            addresses=len(peer.addresses) or 1,
        )
        node.on_change = self.sender.poke
        self.tasks = TaskOwner("heartbeat")
        self.paused = False

    async def start(self) -> None:
        self.tasks.spawn(self.sender.run(), name="heartbeat-stream")

    async def stop(self) -> None:
        await self.tasks.close()

    async def pause(self) -> None:
        """Close the stream: no heartbeat reaches the controller until :meth:`resume`."""
        if self.paused:
            return
        self.paused = True
        await self.tasks.close()
        self.tasks = TaskOwner("heartbeat")
        log.warning("heartbeats paused")

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.tasks.spawn(self.sender.run(), name="heartbeat-stream")
            log.info("heartbeats resumed")

    def on_config_change(self, new: NodeManagerConfig) -> None:
        self.sender.poke()


class ConfigWatcherModule(_Base):
    """Polls the config file's mtime; a valid new config is propagated to every started module."""

    name = "config-watcher"

    def __init__(self, app: NodeManagerApp, path: str) -> None:
        self.app = app
        self.path = path
        self.tasks = TaskOwner("config-watcher")
        self._mtime = _mtime(path)

    async def start(self) -> None:
        self.tasks.spawn(self._watch(), name="config-watch")

    async def stop(self) -> None:
        await self.tasks.close()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.app.config.config_watch_interval_sec)
            mtime = _mtime(self.path)
            if mtime == self._mtime:
                continue
            self._mtime = mtime
            self.app.reload_config()


def default_node_id(cfg: NodeManagerConfig, environ: Mapping[str, str], hostname: str) -> str:
    """The node id: ``node_id`` from the config, else ``POD_NAME``, else ``hostname:job:node_rank``.

    Stable across restarts of the nodemanager (never the admin port, which may be picked at random),
    so a restarted node re-registers under the same id and rejoins its instance."""
    return cfg.node_id or environ.get("POD_NAME") or f"{hostname}:{cfg.job_name}:{cfg.node_rank}"


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime_ns / 1e9
    except OSError:
        return 0.0


class NodeManagerApp(Application):
    name = "nodemanager"

    def __init__(self, config_path: str | None, ports_file: str | None = None) -> None:
        super().__init__()
        self.config_path = config_path
        self.ports_file = ports_file
        self.admin_port = 0
        self._config: NodeManagerConfig | None = None
        self._node: Node | None = None
        self.peer: ControllerPeer | None = None
        self._tasks: TaskOwner | None = None
        self._registering = asyncio.Lock()
        self._stop_task: asyncio.Task[None] | None = None
        self._heartbeat: HeartbeatModule | None = None
        self._snapshot_lock = asyncio.Lock()

    @property
    def config(self) -> NodeManagerConfig:
        assert self._config is not None
        return self._config

    @property
    def node(self) -> Node:
        assert self._node is not None
        return self._node

    @staticmethod
    def _plan_ports(cfg: NodeManagerConfig, avoid: set[int]) -> tuple[Endpoint, ...]:
        return plan_endpoints(
            ip=cfg.ip,
            count=cfg.endpoints_per_node,
            base_port=cfg.base_port,
            engine_type=cfg.engine_type_enum,
            role=cfg.role_enum,
            pick=engine_port_picker(cfg.ip),
            avoid=avoid,
            kv_events=cfg.engine.kv_events.enable,
            kv_events_replay=cfg.engine.kv_events.replay,
        )

    def avoid_own_listeners(self, bound: set[int]) -> None:
        """The engines' ports are picked from the OS (``base_port`` 0) before this process's own
        servers bind; a server on port 0 may then be given a port just picked (and released) for
        an engine, whose start would fail with "address already in use". Called once the servers
        are bound, before the plan is announced (registration): such a plan is made anew."""
        cfg = self.config
        clash = bound & ports_of(self.node.planned)
        if cfg.base_port or not clash:
            return
        log.warning("an engine port planned for this node was taken by its own server: planned anew",
                    extra={"ports": sorted(clash)})
        configured = {p for p in (cfg.server.port, cfg.server.metrics_port) if p}
        self.node.planned = self._plan_ports(cfg, configured | bound)

    async def setup(self) -> None:
        cfg = nmconfig.load(self.config_path)  # config
        self._config = cfg
        setup_logging("nodemanager", cfg.log.level, cfg.log.format)  # logging
        log.info("configuration loaded", extra={"config": orjson.dumps(to_dict(cfg)).decode()})
        if cfg.snapshot_config.enable_snapshot:
            meta = load_metadata(cfg.snapshot_config.metadata_path)  # ConfigError: exit 2
            log.info("snapshot mode: SIGUSR1 = checkpoint, SIGUSR2 = restored; no config watcher",
                     extra={"metadata_path": cfg.snapshot_config.metadata_path, "job_name": meta.job_name,
                            "namespace": meta.namespace, "model_load_path": meta.model_load_path})  # fmt: skip
        self.daemon_interval = cfg.daemon_loop_interval
        self._tasks = TaskOwner("nodemanager")
        # Not yet bound (the servers start later): an OS pick could return them.
        planned = self._plan_ports(cfg, {p for p in (cfg.server.port, cfg.server.metrics_port) if p})  # ports
        self.stall_clock = StallCompensatedClock()
        self._node = Node(lambda: self.config, planned, clock=self.stall_clock)
        services = plan_services(cfg.kv_cache_store_config)
        log.info("services of this node: %s", ", ".join(services))
        self.modules = []
        if KV_CACHE_STORE in services:
            self.modules.append(
                KvStoreModule(self._node, KvStoreWorker(cfg.kv_cache_store_config, cfg.ip))
            )
        self.modules += [EnginesModule(self._node, self.stall_clock), ApiServerModule(self)]
        if cfg.registers:
            self.peer = GrpcController(
                cfg.controller_address,
                self._management_key(),
                tls=cfg.server.tls,
                tls_ca_file=cfg.controller_tls_ca_file,
            )
            peer = self.peer
            self._node.deaths = DeathReporter(
                lambda r: peer.report_fault(r, self.config.fault_tolerance_config.report_timeout_sec),
                self._node.on_fault_accepted,
                lambda: self.config.fault_tolerance_config.report_retry_interval_sec,
            )
            self._node.fault_reporter = FaultReporter(
                lambda: self.config.ip,
                self._zmq_port,
                self._send_publisher_fault,
                lambda: self.config.fault_tolerance_config.zmq_retry_interval_sec,
            )
            self._heartbeat = HeartbeatModule(self, self.peer)
            self.modules += [RegistrationModule(self), self._heartbeat]
        else:
            log.info("KV-store-only node (separated mode): no registration, no heartbeat")
        if self.config_path and not cfg.snapshot_config.enable_snapshot:
            self.modules.append(ConfigWatcherModule(self, self.config_path))

    # --- snapshot checkpoint / restore (see snapshot.py) ------------------------------------------
    def install_extra_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.add_signal_handler(CHECKPOINT_SIGNAL, self._on_snapshot_signal, "checkpoint")
        loop.add_signal_handler(RESTORE_SIGNAL, self._on_snapshot_signal, "restore")

    def _on_snapshot_signal(self, what: str) -> None:
        if self._config is None or self._tasks is None or self.exiting:
            return
        if not self.config.snapshot_config.enable_snapshot:
            log.warning("snapshot %s signal ignored: snapshot_config.enable_snapshot is off", what)
            return
        self._tasks.spawn(
            self.checkpoint() if what == "checkpoint" else self.restore(), name=f"snapshot-{what}"
        )

    async def checkpoint(self) -> None:
        """Before the container is frozen: heartbeats paused, polling and fault reporting stopped."""
        async with self._snapshot_lock:
            await self.node.enter_checkpoint()
            if self._heartbeat is not None:
                await self._heartbeat.pause()
            log.warning("snapshot checkpoint: ready to be frozen; send SIGUSR2 after the restore")

    async def restore(self) -> None:
        """After the container was restored: metadata read again (job name), re-registration,
        heartbeats resumed with state RESTORED; the next start command adopts the running engines."""
        async with self._snapshot_lock:
            try:
                meta = load_metadata(self.config.snapshot_config.metadata_path)
            except ConfigError as exc:
                log.error("snapshot restore: %s", exc.message)
                self.request_exit(2, "invalid snapshot metadata after restore")
                return
            if meta.job_name and meta.job_name != self.config.job_name:
                self._config = dataclasses.replace(self.config, job_name=meta.job_name)
            self.node.mark_restored()
            log.warning("restored from snapshot: waiting for a start command",
                        extra={"job_name": self.config.job_name, "namespace": meta.namespace,
                               "model_load_path": meta.model_load_path,
                               "engine_pids": [p.pid for p in self.node.supervisor.processes]})  # fmt: skip
            if self.peer is not None:
                await self.register(first=True)
                if self._heartbeat is not None and not self.exiting:
                    self._heartbeat.resume()

    def _zmq_port(self) -> int | None:
        ft = self.config.fault_tolerance_config
        return ft.zmq_pub_port if ft.enable_fault_tolerance else None

    async def _send_publisher_fault(self, endpoint_id: int, level: FaultLevel, detail: str) -> bool:
        report = self.node.publisher_report(endpoint_id, level, detail)
        if report is None or self.peer is None:
            return False
        try:
            ack = await self.peer.report_fault(report, self.config.fault_tolerance_config.report_timeout_sec)
        except MotorError as exc:
            log.warning("engine-publisher fault report failed: %s", exc.message, extra={"endpoint_id": endpoint_id})
            return False
        if ack.accepted:
            log.warning("engine-publisher fault reported",
                        extra={"endpoint_id": endpoint_id, "level": level.name, "detail": detail})  # fmt: skip
            self.node.on_fault_accepted(report, ack)
        return ack.accepted

    def _management_key(self) -> Credential:
        """The node credential presented to the controller (server.auth.key_file, else the
        management key)."""
        return presented_key(self.config.server.auth, read_secret(self.config.server.management_key_file))

    async def register(self, *, first: bool) -> None:
        assert self.peer is not None
        peer = self.peer
        reg = self.config.registration
        async with self._registering:
            spec = self.node.spec(self.admin_port)

            async def attempt() -> object:
                return await peer.register(spec, reg.rpc_timeout_sec)

            try:
                result = await register_with_retry(attempt, max_attempts=reg.max_attempts, base_sec=reg.backoff_base_sec)
            except RegistrationFailed as exc:
                log.error("%s", exc)
                if first:
                    self.request_exit(EXIT_RESCHEDULE, "registration failed")
                return
            node_id = getattr(result, "node_id", "") or self.node.node_id
            self.node.node_id = node_id
            self.node.registered = True
            log.info("registered with the controller", extra={"node_id": node_id, "controller": self.config.controller_address})
            self.node.on_change()

    async def stop_node(self, reason: str) -> None:
        """StopNode (seed: stop = stop the engines, then terminate self): the engines are stopped
        before the call is answered; the process exits with the reschedule code (75) after
        ``stop_exit_delay_sec`` so the answer reaches the caller. A cancelled call (client deadline)
        does not interrupt the stop."""
        assert self._tasks is not None
        if self._stop_task is None:
            self.node.stopping = True
            self.node.on_change()

            async def stop() -> None:
                await self.node.stop_engines()
                log.warning("StopNode: engines stopped, exiting in %ss", self.config.stop_exit_delay_sec)

                async def later() -> None:
                    await asyncio.sleep(self.config.stop_exit_delay_sec)
                    self.request_exit(EXIT_RESCHEDULE, f"StopNode: {reason}")

                assert self._tasks is not None
                self._tasks.spawn(later(), name="stop-node-exit")

            self._stop_task = self._tasks.spawn(stop(), name="stop-node")
        await asyncio.shield(self._stop_task)

    def reload_config(self) -> None:
        try:
            new = nmconfig.load(self.config_path)
        except ConfigError as exc:
            log.error("configuration change rejected, keeping the running one: %s", exc.message)
            return
        old = self.config
        if new == old:
            return
        for key in nmconfig.restart_needed(old, new):
            log.warning("configuration key %r changed: needs a restart to take effect", key)
        self._config = _hot(old, new)
        self.daemon_interval = new.daemon_loop_interval
        log.info(
            "configuration reloaded",
            extra={"heartbeat_interval_seconds": new.heartbeat_interval_seconds,
                   "enable_fault_tolerance": new.fault_tolerance_config.enable_fault_tolerance},
        )  # fmt: skip
        self.propagate_config(self._config)

    async def tick(self) -> None:
        verdict = self.node.tick()
        if verdict.terminate:
            log.error("self-termination: %s", verdict.reason)
            self.node.stopping = True
            await self.node.stop_engines()
            self.request_exit(EXIT_RESCHEDULE, f"self-termination: {verdict.reason}")

    async def run(self) -> int:
        try:
            return await super().run()
        finally:
            if self._tasks is not None:
                await self._tasks.close()
            if self._node is not None and self._node.deaths is not None:
                await self._node.deaths.close()
            if self._node is not None and isinstance(self._node.fault_reporter, FaultReporter):
                await self._node.fault_reporter.close()
            if self.peer is not None:
                await self.peer.close()


def _hot(old: NodeManagerConfig, new: NodeManagerConfig) -> NodeManagerConfig:
    """The new config with the restart-only keys kept at their running values."""
    keep = {k: getattr(old, k) for k in nmconfig.restart_needed(old, new)}
    return dataclasses.replace(new, **keep)
