"""The node: what one nodemanager knows and does (the seed's Daemon + RegisterManager).

It owns the start command, the engine processes, the endpoint states, the arbiter and the relaunch
counter. The gRPC servicer is a thin shell over it; the application's daemon loop calls :meth:`tick`.
Everything here runs on one event loop: a check-then-act without an ``await`` in between is atomic.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from motor_common.domain import Capabilities, Endpoint, EndpointHealth, EndpointStatus, NodeSpec
from motor_common.errors import Aborted, FailedPrecondition, Internal, MotorError
from motor_common.tasks import TaskOwner
from motor_nodemanager import adoption
from motor_nodemanager import endpoint_state as es
from motor_nodemanager.arbiter import Arbiter, Verdict
from motor_nodemanager.config import NodeManagerConfig
from motor_nodemanager.controller_client import (
    FaultAck,
    FaultLevel,
    FaultReport,
    FaultSource,
    HeartbeatFrame,
    NodeState,
)
from motor_nodemanager.deaths import DeathReporter
from motor_nodemanager.engines import EngineSupervisor
from motor_nodemanager.health import HealthPoller, PollSettings
from motor_nodemanager.launch import LaunchSettings, plan_launch, settings_from
from motor_nodemanager.services import KvStoreWorker
from motor_nodemanager.start_command import StartCommand, check_payload, validate_for_node

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class NodeStatus:
    node_id: str
    state: NodeState
    instance_id: int
    endpoints: tuple[EndpointHealth, ...]
    frozen: bool
    freeze_deadline: float | None  # wall-clock seconds
    relaunch_count: int
    registered: bool


class PausableReporter(Protocol):
    """The engine-publisher fault reporter, as the relaunch sees it."""

    def watch(self, endpoint_ids: Sequence[int]) -> None: ...

    def pause(self) -> None: ...

    def resume(self, *, reset: bool) -> None: ...


def _simulator_bin() -> str:
    local = os.path.join(os.path.dirname(sys.executable), "motor-sim")
    return local if os.path.exists(local) else "motor-sim"


class Node:
    def __init__(
        self,
        config: Callable[[], NodeManagerConfig],
        planned: tuple[Endpoint, ...],
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self.planned = planned
        self._environ = environ if environ is not None else os.environ
        self._clock = clock
        self.node_id = ""
        self.registered = False
        self.command: StartCommand | None = None
        self.states: dict[int, es.EndpointState] = {}
        self.paused = False
        self.relaunching = False
        self.relaunch_count = 0
        self.stopping = False
        self.restored = False  # snapshot restore: waiting for a start command (no respawn)
        self.checkpointing = False  # snapshot checkpoint in progress (heartbeats paused)
        self._snapshot_cmd: StartCommand | None = (
            None  # what the restored engines were launched for
        )
        self.arbiter = Arbiter(config().health.abnormal_threshold)
        self.state_prefix = ""  # names the engine state file (the node id this process started with)
        # Engines a previous incarnation launched and that still run: adopted by the first start
        # command whose launch plan they match, else stopped (see adoption.py).
        self._recorded: list[adoption.EngineRecord] = []
        self.supervisor = EngineSupervisor(
            on_exit=self._on_engine_exit, adopt_on_restart=self._adoption_on, state_file=self._state_path
        )
        self.poller = HealthPoller(self._poll_settings, self._generation_of, self._on_probe, self.supervisor.pid_of,
                                   clock=clock)
        self._start_lock = asyncio.Lock()
        self.on_change: Callable[[], None] = lambda: None
        # Death reports (set by the application once it has a controller peer).
        self.deaths: DeathReporter | None = None
        self.fault_reporter: PausableReporter | None = None
        self.kv_store: KvStoreWorker | None = None  # the KV-cache store service, when configured
        self._held: set[int] = set()  # endpoints whose death report is in flight (published after it)
        self._bg = TaskOwner("node")
        from motor_nodemanager.scale_down_proxy import ScaleDownProxy

        self.scale_down = ScaleDownProxy(self)

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        """Run *coro* as one of the node's owned tasks (cancelled when the engines stop)."""
        return self._bg.spawn(coro, name=name)

    def clock(self) -> float:
        return self._clock()

    @property
    def cfg(self) -> NodeManagerConfig:
        return self._config()

    # --- identity / registration -------------------------------------------------------------
    def spec(self, admin_port: int) -> NodeSpec:
        c = self.cfg
        ft = c.fault_tolerance_config
        return NodeSpec(
            node_id=self.node_id,
            job_name=c.job_name,
            role=c.role_enum,
            ip=c.ip,
            admin_port=admin_port,
            engine_type=c.engine_type_enum,
            model_name=c.model_name,
            node_rank=c.node_rank,
            nodes_per_instance=c.nodes_per_instance,
            endpoints=self.planned,
            capabilities=Capabilities(
                fault_tolerance=ft.enable_fault_tolerance,
                engine_relaunch=ft.enable_engine_relaunch,
                dp_scale_down=ft.enable_dp_scale_down,
            ),
            local_world_size=c.local_world_size,
        )

    # --- observations --------------------------------------------------------------------------
    def _poll_settings(self) -> PollSettings:
        h = self.cfg.health
        return PollSettings(h.poll_interval_sec, h.timeout_sec, h.port_wait_sec, h.verify_port_owner,
                            h.failure_threshold)

    def _generation_of(self, endpoint_id: int) -> int:
        st = self.states.get(endpoint_id)
        return st.generation if st is not None else 0

    def _apply(self, endpoint_id: int, obs: es.Observation, generation: int, detail: str) -> None:
        old = self.states.get(endpoint_id)
        if old is None or endpoint_id in self._held:
            return
        new = es.observe(
            old, obs, generation=generation, now=self._clock(), grace_sec=self.cfg.health.startup_grace_sec, detail=detail
        )
        report = self._death_of(old, new, obs, detail)
        if report is not None and self.deaths is not None and not self.deaths.ledger.is_duplicate(report):
            if new.status is not old.status:
                # Report first, publish after: the controller starts the recovery (RECOVERING →
                # coordinators PAUSE the instance) before heartbeats show the endpoint ABNORMAL.
                self._held.add(endpoint_id)
                self._bg.spawn(self._report_then_commit(report, old, obs, generation, detail),
                               name=f"death-{endpoint_id}")  # fmt: skip
                return
            self._bg.spawn(self.deaths.report(report), name=f"death-{endpoint_id}")
        self._commit(endpoint_id, old, new, detail)

    def _commit(self, endpoint_id: int, old: es.EndpointState, new: es.EndpointState, detail: str) -> None:
        if new.status is not old.status:
            log.info(
                "endpoint %d %s -> %s",
                endpoint_id,
                old.status.value,
                new.status.value,
                extra={"endpoint_id": endpoint_id, "detail": detail},
            )
        self.states[endpoint_id] = new
        if new.status is EndpointStatus.NORMAL and self.deaths is not None:
            self.deaths.withdraw(endpoint_id)
        if new.status is not old.status:
            self.on_change()

    async def _report_then_commit(
        self, report: FaultReport, before: es.EndpointState, obs: es.Observation, generation: int, detail: str
    ) -> None:
        assert self.deaths is not None
        try:
            await self.deaths.report(report)  # one attempt (bounded by the RPC timeout); retries go on behind
        except asyncio.CancelledError:
            self._held.discard(report.endpoint_id)
            raise
        self._held.discard(report.endpoint_id)
        cur = self.states.get(report.endpoint_id)
        if cur is not None and cur.launched_at == before.launched_at and cur.pid == before.pid:
            self._apply(report.endpoint_id, obs, generation, detail)

    def _death_of(
        self, old: es.EndpointState, new: es.EndpointState, obs: es.Observation, detail: str
    ) -> FaultReport | None:
        """The death report an observation calls for, if any (dedup is the ledger's job)."""
        if self.command is None or not self.node_id or self.relaunching or self.stopping:
            return None
        if old.status is EndpointStatus.RETIRED:
            return None  # retired by a committed DP scale-down: its death is no fault any more
        level = FaultLevel.ENGINE_DEAD
        if obs is es.Observation.EXITED and old.pid:
            source = FaultSource.PROCESS_EXIT
        elif new.status is EndpointStatus.ABNORMAL and old.status is not EndpointStatus.ABNORMAL and new.was_normal:
            source = FaultSource.HEALTH_PROBE
            if self.publisher_on:
                # The process is alive and the engine reports its own faults: a failing /health is
                # "unhealthy" (the controller awaits recovery, then escalates), not a death.
                level = FaultLevel.ENGINE_UNHEALTHY
        else:
            return None
        return FaultReport(
            node_id=self.node_id,
            instance_id=self.command.instance_id,
            endpoint_id=old.endpoint_id,
            level=level,
            source=source,
            pid=old.pid,
            detail=detail,
        )

    @property
    def publisher_on(self) -> bool:
        """The engines publish their own fault state (``vllm_fault``) and the reporter follows it."""
        ft = self.cfg.fault_tolerance_config
        return self.fault_reporter is not None and ft.enable_fault_tolerance and ft.zmq_pub_port is not None

    def publisher_report(self, endpoint_id: int, level: FaultLevel, detail: str) -> FaultReport | None:
        """A fault the engine's own publisher announced, as a report (None when nothing runs)."""
        st = self.states.get(endpoint_id)
        if self.command is None or not self.node_id or st is None or self.relaunching or self.stopping:
            return None
        if st.status is EndpointStatus.RETIRED:
            return None
        return FaultReport(self.node_id, self.command.instance_id, endpoint_id, level, FaultSource.ENGINE_PUBLISHER,
                           st.pid, detail)  # fmt: skip

    def on_fault_accepted(self, report: FaultReport, ack: FaultAck) -> None:
        """A fault report succeeded: freeze self-termination if the controller will handle it in place
        (an engine relaunch, or an await-recovery that escalates to one)."""
        ft = self.cfg.fault_tolerance_config
        if not ack.relaunch_expected or not ft.enable_engine_relaunch:
            return
        if self.command is None or report.instance_id != self.command.instance_id:
            return
        self.arbiter.freeze(self._clock() + ft.engine_restart_freeze_sec)
        log.warning("engine relaunch expected: self-termination frozen for %ss", ft.engine_restart_freeze_sec)
        self.on_change()

    def _on_probe(self, endpoint_id: int, obs: es.Observation, generation: int, detail: str) -> None:
        self._apply(endpoint_id, obs, generation, detail)

    def _on_engine_exit(self, endpoint_id: int, pid: int, returncode: int) -> None:
        st = self.states.get(endpoint_id)
        if st is None or st.pid != pid:
            return
        self._apply(endpoint_id, es.Observation.EXITED, st.generation, f"engine process {pid} exited with {returncode}")

    # --- re-adoption ---------------------------------------------------------------------------------
    def _state_path(self) -> str | None:
        e = self.cfg.engine
        return adoption.state_path(e.state_file, e.log_dir, self.state_prefix or self.node_id)

    def _adoption_on(self) -> bool:
        return self.cfg.engine.adopt_on_restart and self._state_path() is not None

    def load_recorded(self) -> None:
        """At start, before anything is launched: read what the previous incarnation launched. An
        entry whose process is gone or whose pid now belongs to another process (other start time)
        is dropped with a warning and never signalled; the live ones wait for the first start
        command. Their ports are planned again (ports picked from the OS are the engines' own)."""
        path = self._state_path()
        if path is None:
            if self.cfg.engine.adopt_on_restart:
                log.warning("engine.adopt_on_restart is on but neither engine.state_file nor engine.log_dir is "
                            "set: engines are not recorded and die with the nodemanager")  # fmt: skip
            return
        live = []
        for rec in adoption.load(path):
            if adoption.is_recorded_process(rec):
                live.append(rec)
                continue
            why = "process gone" if adoption.process_start_time(rec.pid) is None else "pid reused by another process"
            adoption.ADOPTIONS.labels(outcome="gone").inc()
            log.warning("recorded engine not adopted: %s (not signalled)", why,
                        extra={"endpoint_id": rec.endpoint_id, "pid": rec.pid, "port": rec.business_port})  # fmt: skip
        self._recorded = live
        if live and not self.cfg.base_port:
            self.planned = adoption.with_recorded_ports(self.planned, live)
        if live:
            log.info("engines of a previous nodemanager still run: waiting for the start command to adopt them",
                     extra={"pids": [r.pid for r in live], "path": path})  # fmt: skip

    async def _adopt_recorded(self, cmd: StartCommand) -> list[int] | None:
        """Adopt the engines recorded by the previous incarnation when each is still the recorded
        process and the plan for *cmd* has the same fingerprint; all of them or none (one instance's
        engines form one DP group: fresh ranks next to old ones would not; and only for a single-node
        instance, for the same reason across nodes). None when they are not
        adopted: the recorded processes still running are stopped (SIGTERM, SIGKILL after the stop
        timeout) and the caller launches afresh."""
        recs, self._recorded = self._recorded, []
        plans = {p.endpoint.id: p for p in plan_launch(cmd, self._launch_settings(), self._environ)}
        live = [r for r in recs if adoption.is_recorded_process(r)]
        why: dict[int, str] = {}
        for r in recs:
            plan = plans.get(r.endpoint_id)
            if not self._adoption_on():
                why[r.pid] = "engine.adopt_on_restart is off"
            elif cmd.num_nodes > 1:
                # The controller restarts a multi-node instance whole when it loses a node: its
                # other nodes' engines may be new, and an engine of the old group cannot join them.
                why[r.pid] = f"instance spans {cmd.num_nodes} nodes (only single-node instances are adopted)"
            elif r not in live:
                why[r.pid] = "process gone or pid reused"
            elif plan is None:
                why[r.pid] = "endpoint not in the start command"
            elif adoption.fingerprint(plan) != r.fingerprint:
                why[r.pid] = "launch plan changed (argv or environment)"
        missing = sorted(set(plans) - {r.endpoint_id for r in live})
        if not why and not missing and live:
            return await self._take_over(cmd, live)
        for r in recs:
            reason = why.get(r.pid) or f"endpoint(s) {missing} have no running engine to adopt with it"
            adoption.ADOPTIONS.labels(outcome="gone" if r not in live else "mismatch").inc()
            log.warning("recorded engine not adopted: %s%s", reason, ": stopped" if r in live else " (not signalled)",
                        extra={"endpoint_id": r.endpoint_id, "pid": r.pid, "port": r.business_port})  # fmt: skip
        if live:
            self.supervisor.adopt(live)
            await self.supervisor.stop_all(self.cfg.engine.stop_timeout_sec)
        return None

    async def _watch_endpoints(self, cmd: StartCommand) -> None:
        """Engines just launched, restored or adopted for *cmd*: verdicts and held faults start
        afresh, the health poller and the fault reporter watch its endpoints."""
        self.arbiter.reset()
        self._held.clear()
        if self.deaths is not None:
            self.deaths.reset()
        await self.poller.start(sorted(cmd.endpoints, key=lambda e: e.id))
        if self.fault_reporter is not None:
            self.fault_reporter.watch(sorted(e.id for e in cmd.endpoints))

    async def _serve(self, cmd: StartCommand) -> None:
        """Restored or adopted engines become *cmd*'s (no launch)."""
        await self._watch_endpoints(cmd)
        self.command = cmd
        self.restored = False
        self.paused = False

    async def _take_over(self, cmd: StartCommand, recs: list[adoption.EngineRecord]) -> list[int]:
        recs = sorted(recs, key=lambda r: r.endpoint_id)
        pids = self.supervisor.adopt(recs)
        now = self._clock()
        self.states = {r.endpoint_id: es.launched(r.endpoint_id, generation=cmd.generation, now=now, pid=r.pid)
                       for r in recs}  # fmt: skip
        await self._serve(cmd)
        wall = time.time()
        for r in recs:
            adoption.ADOPTIONS.labels(outcome="adopted").inc()
            log.info("engine adopted from the previous nodemanager (pid %d, port %d, up %.0fs)", r.pid, r.business_port,
                     max(0.0, wall - r.started_at),
                     extra={"endpoint_id": r.endpoint_id, "pid": r.pid, "port": r.business_port,
                            "instance_id": cmd.instance_id})  # fmt: skip
        self.on_change()
        return pids

    async def _stop_recorded(self) -> None:
        """An orderly stop before any start command claimed them: the recorded engines stop too."""
        recs, self._recorded = self._recorded, []
        live = [r for r in recs if adoption.is_recorded_process(r)]
        if live and not self.supervisor.running:
            self.supervisor.adopt(live)
            await self.supervisor.stop_all(self.cfg.engine.stop_timeout_sec)

    # --- start -----------------------------------------------------------------------------------
    def _launch_settings(self) -> LaunchSettings:
        c = self.cfg
        return settings_from(
            launcher=c.launcher,
            model_path=c.model_path,
            local_world_size=c.local_world_size,
            device_count=c.device_count,
            visible_devices_env=c.visible_devices_env,
            command=c.engine.command,
            extra_args=c.engine.extra_args,
            env=self._engine_env(),
            kv_connector=c.engine.kv_connector,
            zmq_pub_port=c.fault_tolerance_config.zmq_pub_port if c.fault_tolerance_config.enable_fault_tolerance else None,
            simulator_bin=_simulator_bin(),
            kv_events_topic=c.engine.kv_events.topic if c.engine.kv_events.enable else None,
        )

    def _engine_env(self) -> dict[str, str]:
        c = self.cfg
        env = dict(c.engine.env)
        if c.snapshot_config.enable_snapshot and c.snapshot_config.metadata_path:
            env.setdefault("MOTOR_SNAPSHOT_METADATA", c.snapshot_config.metadata_path)
        kv = c.kv_cache_store_config
        if kv.enable and kv.mode == "combined" and kv.port:
            env.setdefault("MOTOR_KV_STORE_ADDRESS", f"{c.ip}:{kv.port}")
            env.setdefault("MOTOR_KV_STORE_BACKEND", kv.backend)
        return env

    def validate(self, cmd: StartCommand) -> None:
        check_payload(cmd)
        c = self.cfg
        validate_for_node(cmd, job_name=c.job_name, node_ip=c.ip, endpoint_count=c.endpoints_per_node, role=c.role_enum,
                          engine_type=c.engine_type_enum, model_name=c.model_name)

    async def start_engines(self, cmd: StartCommand) -> list[int]:
        self.validate(cmd)
        if self.stopping:
            raise FailedPrecondition("the node is stopping", reason="NODE_STOPPING")
        if self.relaunching:
            raise Aborted("an engine relaunch is in progress", reason="RELAUNCH_IN_PROGRESS")
        async with self._start_lock:
            if self.restored and self.command is None:
                adopted = await self._adopt(cmd)
                if adopted is not None:
                    return adopted
            if self._recorded and not self.supervisor.running:
                adopted = await self._adopt_recorded(cmd)
                if adopted is not None:
                    return adopted
            if self.command is not None and self.supervisor.running:
                if self.command.same_launch(cmd):
                    for eid, st in self.states.items():
                        self.states[eid] = es.with_generation(st, cmd.generation)
                    log.info("repeated start command for running instance %d: no-op", cmd.instance_id)
                    return [st.pid for st in self.states.values()]
                raise FailedPrecondition(
                    f"engines already running for instance {self.command.instance_id}; stop the node first",
                    reason="ALREADY_STARTED",
                )
            pids = await self._launch(cmd)
            self.command = cmd
            self.restored = False
            self.paused = False
            log.info("engines started", extra={"instance_id": cmd.instance_id, "pids": pids})
            self.on_change()
            return pids

    async def _adopt(self, cmd: StartCommand) -> list[int] | None:
        """Start after a snapshot restore: take over the engines restored with the container (same
        pids, same ports, nothing spawned). None when they cannot be adopted: they are stopped then,
        and the caller launches afresh."""
        snap = self._snapshot_cmd
        self._snapshot_cmd = None
        if snap is None or not self.supervisor.running:
            return None
        wanted = {(e.id, e.business_port) for e in cmd.endpoints}
        have = {(e.id, e.business_port) for e in snap.endpoints}
        pids = {e.id: self.supervisor.pid_of(e.id) for e in cmd.endpoints}
        if wanted != have or not all(pids.values()):
            log.warning(
                "restored engines cannot be adopted (endpoints/ports differ or an engine is gone): relaunching",
                extra={"restored": sorted(have), "wanted": sorted(wanted), "pids": pids},
            )
            await self.supervisor.stop_all(self.cfg.engine.stop_timeout_sec)
            return None
        self.states = {
            e.id: es.with_generation(self.states[e.id], cmd.generation)
            if e.id in self.states
            else es.launched(e.id, generation=cmd.generation, now=self._clock(), pid=pids[e.id])
            for e in cmd.endpoints
        }
        await self._serve(cmd)
        out = [pids[e.id] for e in sorted(cmd.endpoints, key=lambda e: e.id)]
        log.info("engines adopted after snapshot restore (none respawned)",
                 extra={"instance_id": cmd.instance_id, "pids": out})  # fmt: skip
        self.on_change()
        return out

    # --- snapshot checkpoint / restore -------------------------------------------------------------
    async def enter_checkpoint(self) -> None:
        """The checkpoint tool is about to freeze the container: stop polling and fault reporting so
        nothing observed across the freeze counts (heartbeats are paused by the application)."""
        if self.checkpointing:
            return
        self.checkpointing = True
        if self.fault_reporter is not None:
            self.fault_reporter.pause()
        await self.poller.stop()
        log.warning("snapshot checkpoint: health polling and fault reporting paused")

    def mark_restored(self) -> None:
        """The container was restored from a snapshot: the running engines wait to be adopted by the
        next start command; until then the node is RESTORED and unready."""
        self.checkpointing = False
        self.restored = True
        if self.command is not None:
            self._snapshot_cmd = self.command
        self.command = None
        self.paused = False
        self.arbiter.unfreeze()
        self.on_change()

    async def _launch(self, cmd: StartCommand) -> list[int]:
        plans = plan_launch(cmd, self._launch_settings(), self._environ)
        pids = await self.supervisor.launch(plans, self.cfg.engine.log_dir, log_prefix=self.node_id)
        if self.stopping:  # the node began stopping while the engines were spawned: start nothing more
            await self.supervisor.stop_all(self.cfg.engine.stop_timeout_sec)
            raise FailedPrecondition("the node is stopping", reason="NODE_STOPPING")
        now = self._clock()
        self.states = {
            p.endpoint.id: es.launched(p.endpoint.id, generation=cmd.generation, now=now, pid=pid)
            for p, pid in zip(plans, pids, strict=True)
        }
        await self._watch_endpoints(cmd)
        return pids

    async def stop_engines(self) -> None:
        if self.fault_reporter is not None:
            self.fault_reporter.pause()
        await self._bg.close()
        self._bg = TaskOwner("node")
        await self.poller.stop()
        await self.supervisor.stop_all(self.cfg.engine.stop_timeout_sec)
        await self._stop_recorded()
        for eid, st in self.states.items():
            self.states[eid] = es.observe(
                st, es.Observation.EXITED, generation=st.generation, now=self._clock(), grace_sec=0.0, detail="stopped"
            )

    # --- operator verbs --------------------------------------------------------------------------
    def pause(self) -> None:
        self.paused = True
        self.states = {k: es.pause(v) for k, v in self.states.items()}
        self.on_change()

    def resume(self) -> None:
        self.paused = False
        self.states = {k: es.resume(v) for k, v in self.states.items()}
        self.on_change()

    async def restart_engine(self, *, abort: bool, instance_id: int) -> list[int]:
        if abort:
            self.arbiter.unfreeze()
            log.warning("engine relaunch aborted by the controller: self-termination unfrozen")
            return [st.pid for st in self.states.values()]
        if self.restored and self.command is None:
            raise Aborted("restoring from a snapshot", reason="SNAPSHOT_RESTORING")
        if self.relaunching:
            raise Aborted("an engine relaunch is already in progress", reason="RELAUNCH_IN_PROGRESS")
        cmd = self.command
        if cmd is None:
            raise FailedPrecondition("engines were never started on this node", reason="NOT_STARTED")
        if instance_id and instance_id != cmd.instance_id:
            raise FailedPrecondition(
                f"instance {instance_id} is not running here (running {cmd.instance_id})", reason="INSTANCE_MISMATCH"
            )
        if self.stopping:
            raise FailedPrecondition("the node is stopping", reason="NODE_STOPPING")
        self.relaunching = True
        self.on_change()
        ft = self.cfg.fault_tolerance_config
        self.arbiter.freeze(self._clock() + ft.engine_restart_freeze_sec)
        if self.fault_reporter is not None:
            self.fault_reporter.pause()  # the publisher is down while the engine is: no false deaths
        try:
            async with self._start_lock:
                await self.poller.stop()
                await self.supervisor.stop_all(self.cfg.engine.stop_timeout_sec)
                self.relaunch_count += 1
                stamp = time.strftime("%Y-%m-%d %H:%M:%S")
                print(f"[ENGINE RELAUNCH #{self.relaunch_count}] {stamp} instance {cmd.instance_id}", flush=True)
                pids = await self._launch(cmd)
            await self._wait_normal(ft.engine_restart_wait_timeout_sec)
        except MotorError as exc:
            self.arbiter.unfreeze()
            await self.poller.stop()
            await self.supervisor.stop_all(self.cfg.engine.stop_timeout_sec)  # nothing half-started stays
            # Nothing runs any more: every endpoint is ABNORMAL (and counts as once NORMAL — it was,
            # before the relaunch) so the arbiter restarts the node.
            for eid, st in self.states.items():
                self.states[eid] = dataclasses.replace(es.observe(
                    st, es.Observation.EXITED, generation=st.generation, now=self._clock(), grace_sec=0.0,
                    detail=f"relaunch failed: {exc.message}",
                ), was_normal=True)  # fmt: skip
            log.error("engine relaunch failed: self-termination unfrozen: %s", exc.message)
            raise Internal(f"Failed to relaunch engine: {exc.message}", reason="RELAUNCH_FAILED") from exc
        finally:
            self.relaunching = False
            if self.fault_reporter is not None:
                self.fault_reporter.resume(reset=True)
            self.on_change()
        log.info("engines relaunched", extra={"relaunch_count": self.relaunch_count, "pids": pids})
        return pids

    async def _wait_normal(self, timeout: float) -> None:
        """Relaunched engines must all be NORMAL within *timeout* (``engine_restart_wait_timeout_sec``)."""
        deadline = self._clock() + timeout
        while True:
            states = [s for s in self.states.values() if s.status is not EndpointStatus.RETIRED]
            if states and all(s.status is EndpointStatus.NORMAL for s in states):
                return
            gone = [s.endpoint_id for s in states if not self.supervisor.pid_of(s.endpoint_id)]
            if gone:
                raise Internal(f"relaunched engine of endpoint(s) {gone} exited before it was NORMAL",
                               reason="ENGINE_EXITED")  # fmt: skip
            if self._clock() >= deadline:
                raise Internal(f"relaunched engines not NORMAL within {timeout:g}s (engine_restart_wait_timeout_sec)",
                               reason="RELAUNCH_TIMEOUT")  # fmt: skip
            await asyncio.sleep(0.05)

    # --- DP scale-down ---------------------------------------------------------------------------
    def retire(self, endpoint_ids: Sequence[int], detail: str) -> None:
        """A committed DP scale-down retired these endpoints: RETIRED in heartbeats and status, never
        polled, never reported dead, ignored by the arbiter (until the engines are launched again)."""
        ids = [i for i in endpoint_ids if i in self.states]
        for eid in ids:
            self.states[eid] = dataclasses.replace(self.states[eid], status=EndpointStatus.RETIRED, detail=detail)
            self._held.discard(eid)
            if self.deaths is not None:
                self.deaths.withdraw(eid)
        log.warning("endpoints retired by DP scale-down: %s", ids, extra={"detail": detail})
        cmd = self.command
        if cmd is not None:
            survivors = sorted((e for e in cmd.endpoints if self._status_of(e.id) is not EndpointStatus.RETIRED),
                               key=lambda e: e.id)  # fmt: skip
            self._bg.spawn(self.poller.start(survivors), name="poll-survivors")
            if self.fault_reporter is not None:
                self.fault_reporter.watch([e.id for e in survivors])
        self.on_change()

    def _status_of(self, endpoint_id: int) -> EndpointStatus | None:
        st = self.states.get(endpoint_id)
        return st.status if st is not None else None

    # --- daemon ----------------------------------------------------------------------------------
    def tick(self) -> Verdict:
        self.scale_down.expire()
        now = self._clock()
        self.arbiter.threshold = self.cfg.health.abnormal_threshold
        visible = [s for s in self.states.values() if s.status is not EndpointStatus.RETIRED]
        if self.arbiter.is_frozen(now) and visible and all(s.status is EndpointStatus.NORMAL for s in visible):
            # Every endpoint NORMAL again (relaunched, or recovered by itself) and no report in flight:
            # nothing left to protect from self-termination.
            if not self.relaunching and not self._held:
                log.info("engines are NORMAL again: self-termination unfrozen")
                self.arbiter.unfreeze()
        # No arbitration on state a start command is about to replace: a running StartEngines, or
        # engines restored from a snapshot that no start command has adopted yet (node RESTORED).
        replacing = self._start_lock.locked() or (self.restored and self.command is None)
        verdict = self.arbiter.tick(visible, now, replacing=replacing)
        if verdict.freeze_expired:
            log.warning("self-termination freeze expired")
        for eid, n in verdict.streaks:
            log.warning(
                "Consecutive abnormal heartbeat count: %d/%d", n, self.arbiter.threshold, extra={"endpoint_id": eid}
            )
        return verdict

    # --- views -----------------------------------------------------------------------------------
    def node_state(self) -> NodeState:
        if self.stopping:
            return NodeState.STOPPING
        if self.relaunching:
            return NodeState.RELAUNCHING
        if self.command is None:
            if self.restored:
                return NodeState.RESTORED
            return NodeState.REGISTERED if self.registered else NodeState.UNSPECIFIED
        if self.paused:
            return NodeState.PAUSED
        if self.states and all(s.was_normal for s in self.states.values()):
            return NodeState.RUNNING
        return NodeState.STARTING

    def endpoint_health(self) -> tuple[EndpointHealth, ...]:
        return tuple(
            EndpointHealth(s.endpoint_id, s.status, s.generation, s.pid if self.supervisor.pid_of(s.endpoint_id) else 0,
                           s.was_normal, s.detail)
            for s in sorted(self.states.values(), key=lambda s: s.endpoint_id)
        )  # fmt: skip

    def status(self) -> NodeStatus:
        until = self.arbiter.frozen_until
        now = self._clock()
        frozen = self.arbiter.is_frozen(now)
        deadline = time.time() + (until - now) if (frozen and until is not None) else None
        return NodeStatus(
            self.node_id,
            self.node_state(),
            self.command.instance_id if self.command else 0,
            self.endpoint_health(),
            frozen,
            deadline,
            self.relaunch_count,
            self.registered,
        )

    def readiness(self) -> tuple[bool, str]:
        if self.restored and self.command is None:
            return False, "restored from snapshot, waiting for a start command"
        if self.checkpointing:
            return False, "snapshot checkpoint in progress: heartbeats paused"
        if self.kv_store is not None:
            ok, why = self.kv_store.healthy()
            if not ok:
                return False, why
            if not self.cfg.registers:
                return True, f"{why} (KV-store-only node)"
        if self.stopping:
            return False, "stopping"
        if self.relaunching:
            return False, "relaunching engines"
        if self.paused:
            return False, "paused"
        if not self.states:
            return False, "no endpoints: waiting for a start command"
        bad = [s for s in self.states.values() if s.status not in (EndpointStatus.NORMAL, EndpointStatus.RETIRED)]
        if bad:
            desc = ", ".join(f"endpoint {s.endpoint_id} {s.status.value}" for s in bad)
            return False, f"not all endpoints NORMAL: {desc}"
        if self.cfg.snapshot_config.enable_snapshot:
            return True, "steady point reached: all endpoints NORMAL, ready to be checkpointed"
        return True, "all endpoints NORMAL"

    def heartbeat_frame(self) -> HeartbeatFrame:
        return HeartbeatFrame(
            node_id=self.node_id,
            state=self.node_state(),
            instance_id=self.command.instance_id if self.command else 0,
            endpoints=self.endpoint_health(),
            relaunch_count=self.relaunch_count,
        )
