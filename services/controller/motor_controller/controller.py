"""The controller core: registry, heartbeat intake, the reconcile loop, alarms, admin operations.

State is split as STYLE rule 9/10 asks: *desired* state (node specs, instances, job incarnations,
alarms) is persisted in the :class:`~motor_controller.store.Store`; *observed* state (heartbeats)
is memory only. Heartbeats only update observed state; the scheduled reconcile loop reads the whole
of both, plans (``reconcile.plan``, pure) and applies the plan (persist, StartEngines, poke pushers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import orjson

from motor_common.domain import Instance, NodeSpec
from motor_common.errors import (
    FailedPrecondition,
    Internal,
    MotorError,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from motor_common.stall_clock import StallCompensatedClock, lag_monitor
from motor_common.tasks import TaskOwner
from motor_controller import codec, operator_pause
from motor_controller import scale_down as sdown
from motor_controller.alarms import Alarm, AlarmAction, AlarmKind, AlarmStore
from motor_controller.assembly import StartCommand
from motor_controller.codec import KEYS
from motor_controller.config import ControllerConfig
from motor_controller.fault_manager import FaultManager
from motor_controller.fault_policy import (
    AWAIT_RECOVERY,
    DP_SCALE_DOWN,
    ENGINE_RELAUNCH,
    NODE_RESTART,
    Outcome,
    Progress,
    Strategy,
    StrategyResult,
)
from motor_controller.instance_fsm import Signal, observe, transition
from motor_controller.model import (
    FaultReport,
    InstanceState,
    ManagedInstance,
    NodeObservation,
    NodeRecord,
    NodeState,
)
from motor_controller.node_restarter import NodeRestarter, StopNodeRestarter
from motor_controller.peers import CoordinatorClient, NodeManagers
from motor_controller.push_plan import desired_view, fingerprint, kept_without_node
from motor_controller.pusher import CoordinatorPusher
from motor_controller.reconcile import World, deleted_to_forget, node_alive, plan
from motor_controller.registry import Registration, decide_registration, validate_spec
from motor_controller.store import Store
from motor_controller.strategies.await_recovery import AwaitRecovery
from motor_controller.strategies.dp_scale_down import DpScaleDown, ScaleDownPeers
from motor_controller.strategies.dp_scale_down import Target as SdTarget
from motor_controller.strategies.engine_relaunch import EngineRelaunch, Target
from motor_controller.strategies.node_restart import NodeRestart

# How long a promotion announcement waits for a configured coordinator to confirm it.
PROMOTION_CHECK_SEC = 1.5
# Active alarms the controller holds (each is persisted and reloaded at start-up); a RAISE of a
# new alarm beyond it is RESOURCE_EXHAUSTED.
MAX_ACTIVE_ALARMS = 10_000
# DELETED instance records kept (GetInstance still answers them); older ones are forgotten.
MAX_DELETED_KEPT = 1000

log = logging.getLogger(__name__)

START_FAILURE_BACKOFF = 1.0
T = TypeVar("T")


def _decode_incarnation(raw: bytes) -> int:
    return int(orjson.loads(raw)["incarnation"])


def _required(key: str, decoder: Callable[[bytes], T], raw: bytes) -> T:
    """Decode a record the controller cannot act without. Nobody sends an instance, a job
    incarnation or a scale-down transaction again: skipping one would take a live instance off
    every coordinator (the pushers' SET omits it), could reuse an instance id or replay a
    scale-down. ``load()`` fails instead, naming the key."""
    try:
        return codec.decode(key, decoder, raw)
    except codec.RecordError as exc:
        log.error("a store record the controller cannot act without cannot be decoded", extra={"key": key})
        raise Internal(f"{exc}; the controller does not act without it: repair or delete the record (or run the "
                       "version that wrote it)", reason="STORE_RECORD_UNREADABLE", metadata={"key": key}) from exc


class Controller:
    def __init__(
        self,
        config: ControllerConfig,
        store: Store,
        node_managers: NodeManagers,
        coordinators: Sequence[CoordinatorClient] = (),
        *,
        clock: Callable[[], float] | None = None,
        wall: Callable[[], float] = time.time,
        restarter: NodeRestarter | None = None,
        coordinator_factory: Callable[[str], CoordinatorClient] | None = None,
        scale_down_peers: ScaleDownPeers | None = None,
    ) -> None:
        self.scale_down_peers = scale_down_peers
        self.scale_downs: dict[int, sdown.Record] = {}  # DP scale-down transactions (persisted)
        self.config = config
        self.store = store
        self.node_managers = node_managers
        self.restarter: NodeRestarter = restarter if restarter is not None else StopNodeRestarter(node_managers)
        # Default: heartbeat ages and every other timer of the controller stop while its event loop
        # is stalled (stall_clock.py), so load alone never makes a node look lost.
        self.stall_clock: StallCompensatedClock | None = None
        if clock is None:
            clock = self.stall_clock = StallCompensatedClock()
        self._clock = clock
        self._clock_tasks = TaskOwner("controller-clock")
        self._wall = wall
        self.started_at = self._clock()
        # Until then a node loaded from the store that has not heartbeated yet is UNKNOWN (never
        # lost): the fleet's heartbeat streams re-attach after a restart or an election.
        self.reattach_until = self.started_at + config.reattach_grace()
        self.epoch = ""
        self.nodes: dict[str, NodeRecord] = {}
        self.observations: dict[str, NodeObservation] = {}
        self.instances: dict[int, ManagedInstance] = {}
        self.incarnations: dict[str, int] = {}
        self.signals: dict[int, Signal] = {}
        self.start_gates: dict[str, tuple[int, float]] = {}
        self.alarms = AlarmStore()
        self.unreadable: dict[str, str] = {}  # store key -> why it was skipped at the last load
        self._alarm_lock = asyncio.Lock()  # one alarm change at a time: store write, then memory
        # Told of every alarm RAISE/CLEAR applied (alarm delivery, alarm_webhook.py); must not block.
        self.on_alarm: Callable[[Alarm], None] | None = None
        self._precision_recoveries: set[tuple[int, ...]] = set()
        self.faults: deque[FaultReport] = deque(maxlen=1000)
        self.starts_sent: list[StartCommand] = []  # bounded log for observability and tests
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._tasks = TaskOwner("controller")
        self._desired_fp = ""
        # instance id -> routable_until of instances kept in routing with a node lost (logged once each)
        self.routed_without_node: dict[int, float] = {}
        self.coordinator_factory = coordinator_factory
        self.acting = False  # background work running (always, unless a controller election pauses it)
        self.pushers: list[CoordinatorPusher] = []
        self._pusher_tasks: dict[str, asyncio.Task[Any]] = {}
        # Push targets: the configured coordinators, plus at most one master that announced itself
        # (promotion alarm) during this term of this controller; nothing else ever gets the key.
        self.configured_coordinators = frozenset(c.address for c in coordinators)
        if not self.configured_coordinators and coordinator_factory is not None:
            log.warning("no coordinators configured: a coordinator that announces itself master becomes a push "
                        "target (and receives this controller's key) unconfirmed, on the word of any node key; "
                        "list the coordinators in `coordinators` so announcements are confirmed (docs/ha.md)")
        self.announced_master: str | None = None
        for c in coordinators:
            self._add_pusher(c)
        self.fault_manager = self._new_fault_manager()

    def _new_fault_manager(self) -> FaultManager:
        return FaultManager(
            lambda: self.config.fault_tolerance_config,
            self,
            self._build_strategy,
            healthy_wait_sec=2 * self.config.heartbeat_timeout_sec,
            clock=self._clock,
        )

    def _add_pusher(self, client: CoordinatorClient) -> CoordinatorPusher:
        pusher = CoordinatorPusher(
            client,
            self.desired_view,
            self.store,
            sync_interval=self.config.sync_interval_sec,
            set_retry_interval=self.config.set_retry_interval_sec,
            clock=self._clock,
            hold_until=lambda: self.reattach_until,
            knows=lambda iid: iid in self.instances,
        )
        self.pushers.append(pusher)
        if self.acting:
            self._pusher_tasks[client.address] = self._tasks.spawn(pusher.run(), name=f"pusher:{client.address}")
        return pusher

    async def _drop_pusher(self, pusher: CoordinatorPusher, why: str) -> None:
        """Stop pushing to *pusher*'s coordinator for good: task cancelled, channel closed, its
        persisted generation deleted (a stale address is never contacted again)."""
        address = pusher.client.address
        self.pushers.remove(pusher)
        task = self._pusher_tasks.pop(address, None)
        if task is not None:
            task.cancel()
        try:
            await pusher.client.close()
            await self.store.delete(pusher.key)
        except MotorError as exc:
            log.warning("could not forget a coordinator target", extra={"coordinator": address, "error": exc.message})
        log.info("coordinator target dropped", extra={"coordinator": address, "why": why})

    # ---- life cycle -------------------------------------------------------------------------

    async def load(self) -> None:
        """Resume nodes, instances, incarnations and alarms from the store (what memory held before
        is dropped: a controller promoted by the election starts from the store, like a restart)."""
        self.nodes, self.observations, self.instances, self.incarnations = {}, {}, {}, {}
        self.signals, self.start_gates, self.alarms = {}, {}, AlarmStore()
        await self._check_store_format()
        raw = await self.store.get(KEYS.META_EPOCH)
        if raw is None:
            self.epoch = uuid.uuid4().hex
            await self.store.put(KEYS.META_EPOCH, self.epoch.encode())
        else:
            self.epoch = raw.decode()
        # A record that cannot be decoded: nodes and alarms are skipped (their owners send them
        # again: a nodemanager re-registers when its heartbeat is refused, a coordinator re-raises)
        # and kept in the store (a newer version may read them); instances, job incarnations and
        # scale-down transactions are not (see _required).
        self.unreadable = {}
        for key, value in await self.store.list(KEYS.NODE):
            if (rec := self._relearnable(key, codec.decode_node, value)) is not None:
                self.nodes[rec.spec.node_id] = rec
        for key, value in await self.store.list(KEYS.INSTANCE):
            mi = _required(key, codec.decode_instance, value)
            self.instances[mi.id] = mi
        for key, value in await self.store.list(KEYS.JOB):
            self.incarnations[key[len(KEYS.JOB) :]] = _required(key, _decode_incarnation, value)
        self.scale_downs = {}
        for key, value in await self.store.list(KEYS.SCALE_DOWN):
            txn = _required(key, sdown.decode, value)
            self.scale_downs[txn.instance_id] = txn
        for key, value in await self.store.list(KEYS.ALARM):
            if (alarm := self._relearnable(key, codec.decode_alarm, value)) is not None:
                self.alarms.report(alarm)
        # A new term of this controller: only configured coordinators are targets until a master
        # announces itself again; generations persisted for any other address (an earlier
        # announced master, an earlier configuration) are stale and deleted, never pushed to.
        for pusher in [p for p in self.pushers if p.client.address not in self.configured_coordinators]:
            await self._drop_pusher(pusher, "announced in an earlier term")
        self.announced_master = None
        stale = [key for key, _ in await self.store.list(KEYS.COORDINATOR)
                 if key[len(KEYS.COORDINATOR):] not in self.configured_coordinators]
        if stale:
            await self.store.batch({}, stale)
            log.info("dropped stale coordinator addresses from the store",
                     extra={"coordinators": [k[len(KEYS.COORDINATOR):] for k in stale]})
        for pusher in self.pushers:
            await pusher.load()
        self.started_at = self._clock()
        self.reattach_until = self.started_at + self.config.reattach_grace()
        log.info(
            "controller state loaded; waiting for the fleet to re-attach before judging any node",
            extra={"nodes": len(self.nodes), "instances": len(self.instances), "epoch": self.epoch,
                   "reattach_grace_sec": self.config.reattach_grace()},
        )

    async def _check_store_format(self) -> None:
        """Refuse a store written in a newer record format (a downgrade would misread it, then
        overwrite it); mark a store without the key as this version's format."""
        raw = await self.store.get(KEYS.META_FORMAT)
        try:
            found = codec.store_format(raw)
        except codec.RecordError as exc:
            raise Internal(f"{exc}; repair the record (it holds the store's format, 1 for this version)",
                           reason="STORE_RECORD_UNREADABLE", metadata={"key": KEYS.META_FORMAT}) from exc
        if found > codec.STORE_FORMAT:
            log.error("the store was written by a newer Motor", extra={"format": found, "readable": codec.STORE_FORMAT})
            raise Internal(f"the store holds records in format {found}, written by a newer Motor; this version reads "
                           f"format {codec.STORE_FORMAT} and does not act on it: run that version or a newer one",
                           reason="STORE_FORMAT_NEWER", metadata={"key": KEYS.META_FORMAT, "format": str(found)})
        if raw is None:
            await self.store.put(KEYS.META_FORMAT, str(codec.STORE_FORMAT).encode())

    def _relearnable(self, key: str, decoder: Callable[[bytes], T], raw: bytes) -> T | None:
        """Decode a record whose owner sends it again (a node, an alarm); one that cannot be decoded
        is skipped (ERROR log, ``unreadable``, the metric ``motor_controller_store_records_unreadable``)."""
        try:
            return codec.decode(key, decoder, raw)
        except codec.RecordError as exc:
            self.unreadable[key] = str(exc)
            log.error("skipped a store record that cannot be decoded (its owner sends it again)",
                      extra={"key": key, "error": str(exc)})
            return None

    def start(self) -> None:
        if self.stall_clock is not None and len(self._clock_tasks) == 0:
            self._clock_tasks.spawn(lag_monitor(self.stall_clock, log, "heartbeat ages"), name="lag-monitor")
        self.acting = True
        self._tasks.spawn(self._reconcile_loop(), name="reconcile")
        for rec in list(self.scale_downs.values()):
            if rec.in_flight:  # interrupted: RECONFIGURING again, never replaying apply
                log.warning("resuming interrupted DP scale-down", extra={"instance_id": rec.instance_id,
                                                                       "phase": rec.phase.value})
                self.fault_manager.resume(rec.instance_id, DP_SCALE_DOWN)
        for mi in list(self.instances.values()):
            # Left RECOVERING by a controller that died mid-strategy. An engine relaunch is resumed
            # (idempotent: nodes already relaunching or relaunched get no second command, one the
            # previous controller never reached gets it now: engine_relaunch.resume_plan); any other
            # recovery is watched; if it does not recover within await_recovery_timeout_sec, the
            # usual escalation relaunches it. Never left paused.
            if mi.state is InstanceState.RECOVERING and mi.id not in self.fault_manager.running:
                name = ENGINE_RELAUNCH if mi.reason.endswith(ENGINE_RELAUNCH) else AWAIT_RECOVERY
                if self.fault_manager.resume(mi.id, name):
                    log.warning("resuming an interrupted recovery", extra={"instance_id": mi.id, "reason": mi.reason,
                                                                          "strategy": name})
        for alarm in self.alarms.active():  # raised before a restart or takeover: recover now
            if self._start_precision_recovery(alarm):
                log.warning("resumed precision alarm recovery", extra={"instance_ids": list(alarm.instance_ids)})
        for pusher in self.pushers:
            self._pusher_tasks[pusher.client.address] = self._tasks.spawn(
                pusher.run(), name=f"pusher:{pusher.client.address}")

    async def pause(self) -> None:
        """Stop acting (this controller lost the election): background work stops, clients stay.
        The reconcile loop and the pushers are cancelled first: closing the fault manager can take
        seconds (its aborts get a grace), and a demoted controller must not push meanwhile."""
        self.acting = False
        await self._tasks.close()
        await self.fault_manager.close()
        self._tasks = TaskOwner("controller")
        self.fault_manager = self._new_fault_manager()

    async def close(self) -> None:
        self.acting = False
        await self._tasks.close()
        await self.fault_manager.close()
        await self._clock_tasks.close()
        for pusher in self.pushers:
            await pusher.client.close()
        await self.node_managers.close()
        close_sd = getattr(self.scale_down_peers, "close", None)
        if close_sd is not None:
            await close_sd()

    def poke(self) -> None:
        self._wake.set()

    # ---- registry and heartbeats ------------------------------------------------------------

    def is_alive(self, node_id: str) -> bool:
        rec = self.nodes.get(node_id)
        return rec is not None and node_alive(
            rec, self.observations.get(node_id), self._clock(), self.config.heartbeat_timeout_sec
        )

    async def register_node(self, spec: NodeSpec) -> Registration:
        spec = validate_spec(spec)
        async with self._lock:
            existing = self.nodes.get(spec.node_id)
            same_job = [r for r in self.nodes.values() if r.spec.job_name == spec.job_name]
            alive = {r.spec.node_id: self.is_alive(r.spec.node_id) for r in [*same_job, *([existing] if existing else [])]}
            decision, displaced = decide_registration(spec, existing, same_job, alive)
            rec = NodeRecord(
                spec=spec,
                registered_at=existing.registered_at if decision is Registration.IDEMPOTENT and existing else self._wall(),
                registered_mono=self._clock(),
            )
            await self.store.batch(
                {f"{KEYS.NODE}{spec.node_id}": codec.encode_node(rec)}, [f"{KEYS.NODE}{n}" for n in displaced]
            )
            for node_id in displaced:
                self.nodes.pop(node_id, None)
                self.observations.pop(node_id, None)
            self.nodes[spec.node_id] = rec
            if decision is not Registration.IDEMPOTENT:
                self.observations.pop(spec.node_id, None)  # a new nodemanager process
            self.start_gates.pop(spec.node_id, None)
        log.info(
            "node registered",
            extra={"node_id": spec.node_id, "job": spec.job_name, "rank": spec.node_rank,
                   "decision": decision.value, "displaced": displaced},
        )
        self.poke()
        return decision

    def heartbeat(self, node_id: str, ob: NodeObservation) -> bool:
        """Record one heartbeat frame; False when the node is unknown (it must re-register)."""
        if node_id not in self.nodes:
            return False
        prev = self.observations.get(node_id)
        self.observations[node_id] = ob
        if (
            prev is None
            or prev.state is not ob.state
            or prev.instance_id != ob.instance_id
            or [h.status for h in prev.endpoints] != [h.status for h in ob.endpoints]
        ):
            self.poke()  # something observable changed: reconcile soon (the loop still reads everything)
        return True

    # ---- faults and alarms ------------------------------------------------------------------

    async def report_fault(self, report: FaultReport) -> tuple[bool, bool]:
        """Record a fault and let the fault manager decide; answered after RECOVERING is persisted.
        A report for an instance the reporting node does not serve changes nothing (a stale or
        buggy nodemanager must not send another instance into recovery)."""
        mi = self.instances.get(report.instance_id)
        if mi is not None and report.node_id not in mi.node_ids:
            raise FailedPrecondition(
                f"node {report.node_id[:200]!r} does not serve instance {report.instance_id}: the report is ignored",
                reason="NODE_NOT_IN_INSTANCE")
        self.faults.append(report)
        relaunch = await self.fault_manager.on_fault(report)
        log.warning(
            "engine fault reported",
            extra={"node_id": report.node_id, "instance_id": report.instance_id, "endpoint_id": report.endpoint_id,
                   "level": report.level, "source": report.source, "relaunch_expected": relaunch},
        )
        return True, relaunch

    # ---- fault manager host -------------------------------------------------------------------

    def instance(self, instance_id: int) -> ManagedInstance | None:
        return self.instances.get(instance_id)

    def instance_healthy(self, instance_id: int) -> bool:
        mi = self.instances.get(instance_id)
        if mi is None:
            return False
        sig, _ = observe(mi, self.nodes, self.observations, self._clock(), self.config.heartbeat_timeout_sec,
                         self.reattach_until)  # fmt: skip
        return sig in (Signal.HEALTHY, Signal.PAUSED)

    def node_gone(self, node_id: str) -> bool:
        """Stopping, no longer heartbeating, or forgotten (a restarted node)."""
        ob = self.observations.get(node_id)
        if node_id not in self.nodes:
            return True
        if ob is not None and ob.state is NodeState.STOPPING:
            return True
        return not self.is_alive(node_id)

    def _build_strategy(
        self,
        name: str,
        mi: ManagedInstance,
        progress: Progress,
        nodes: Sequence[str],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> Strategy | None:
        ft = self.config.fault_tolerance_config
        specs = [self.nodes[n].spec for n in nodes if n in self.nodes]

        def deleted(iid: int) -> bool:
            cur = self.instances.get(iid)
            return cur is None or not cur.live

        if name == ENGINE_RELAUNCH:
            targets = [Target(s.node_id, s.admin_address) for s in specs]
            if len(targets) != len(mi.node_ids):
                return None  # some node is not even registered: nothing to relaunch with
            return EngineRelaunch(self.node_managers, ft, targets, progress, deleted=deleted, spawn=spawn,
                                  clock=self._clock, call_margin=self.config.rpc_timeout_sec,
                                  resumed=progress.phase == "recovered")  # fmt: skip
        if name == AWAIT_RECOVERY:
            return AwaitRecovery(ft, progress, healthy=self.instance_healthy, deleted=deleted, clock=self._clock)
        if name == NODE_RESTART:
            if not specs:
                return None
            return NodeRestart(
                self.restarter, specs, progress, reason=f"node restart for instance {mi.id}",
                gone=self.node_gone, wait_timeout=self.config.node_restart.wait_timeout_sec, clock=self._clock,
            )  # fmt: skip
        if name == DP_SCALE_DOWN and self.scale_down_peers is not None:
            sd_targets = [SdTarget(s.node_id, s.admin_address) for s in specs]
            prev = self.scale_downs.get(mi.id)
            resume = prev if prev is not None and prev.in_flight else None
            dead = self._dead_ranks(mi)
            if len(sd_targets) != len(mi.node_ids) or (resume is None and not dead):
                return None
            return DpScaleDown(
                self.scale_down_peers, ft, sd_targets, progress, dead_ranks=dead, save=self._save_scale_down,
                deleted=deleted, committed=prev.committed_dead_ranks if prev else (), resume=resume, clock=self._clock,
            )  # fmt: skip
        log.warning("fault strategy %s is not available", name, extra={"instance_id": mi.id})
        return None

    def _dead_ranks(self, mi: ManagedInstance) -> tuple[int, ...]:
        """DP rank of the latest ENGINE_DEAD report for *mi*."""
        for r in reversed(self.faults):
            if r.instance_id == mi.id and r.level == "engine_dead" and mi.instance is not None:
                rank = sdown.dead_rank_of(mi.instance, r.node_id, r.endpoint_id)
                return () if rank is None else (rank,)
        return ()

    def retired_dp_ranks(self, instance_id: int) -> list[int]:
        rec = self.scale_downs.get(instance_id)
        return list(rec.committed_dead_ranks) if rec is not None else []

    def scale_down_eligible(self, instance_id: int, report: FaultReport) -> bool:
        mi = self.instances.get(instance_id)
        if mi is None or mi.instance is None or self.scale_down_peers is None:
            return False
        rank = sdown.dead_rank_of(mi.instance, report.node_id, report.endpoint_id)
        ok, why = sdown.eligible(
            enabled=self.config.fault_tolerance_config.enable_dp_scale_down,
            instance=mi.instance,
            node_capable=[n in self.nodes and self.nodes[n].spec.capabilities.dp_scale_down for n in mi.node_ids],
            dead_ranks=() if rank is None else (rank,),
            retired=mi.withdrawn_dp_ranks,
        )
        if not ok:
            log.info("DP scale-down not eligible: %s", why, extra={"instance_id": instance_id})
        return ok

    async def _save_scale_down(self, rec: sdown.Record) -> None:
        """Persist the transaction record and the instance's withdrawn ranks in one batch; the push plan
        (level-triggered) then shows coordinators the instance without them."""
        async with self._lock:
            puts = {f"{KEYS.SCALE_DOWN}{rec.instance_id}": sdown.encode(rec)}
            mi = self.instances.get(rec.instance_id)
            if mi is not None and mi.withdrawn_dp_ranks != rec.withdrawn:
                mi = replace(mi, withdrawn_dp_ranks=rec.withdrawn)
                puts[f"{KEYS.INSTANCE}{mi.id}"] = codec.encode_instance(mi)
            await self.store.batch(puts)
            self.scale_downs[rec.instance_id] = rec
            if mi is not None:
                self.instances[mi.id] = mi
        self._after_change()

    async def begin_recovery(self, instance_id: int, strategy: str) -> bool:
        async with self._lock:
            mi = self.instances.get(instance_id)
            if mi is None:
                return False
            nxt = transition(mi.state, Signal.RECOVERY_BEGIN)
            if nxt is None:
                return False
            mi = replace(mi, state=nxt, reason=f"recovering: {strategy}", state_changed_at=self._wall(),
                         routable_until=0.0)
            await self.store.put(f"{KEYS.INSTANCE}{mi.id}", codec.encode_instance(mi))
            self.instances[mi.id] = mi
        log.info("instance state", extra={"instance_id": instance_id, "to": mi.state.value, "reason": mi.reason})
        self._after_change()
        return True

    async def end_recovery(self, instance_id: int, result: StrategyResult) -> None:
        async with self._lock:
            mi = self.instances.get(instance_id)
            if mi is None or mi.state is not InstanceState.RECOVERING:
                return
            sig = Signal.RECOVERY_DONE if result.outcome is Outcome.DONE else Signal.RECOVERY_FAILED
            nxt = transition(mi.state, sig)
            assert nxt is not None
            mi = replace(mi, state=nxt, reason=f"recovery {result.outcome.value}: {result.detail}",
                         state_changed_at=self._wall(), routable_until=0.0)  # fmt: skip
            observed, why = observe(mi, self.nodes, self.observations, self._clock(),
                                    self.config.heartbeat_timeout_sec, self.reattach_until)  # fmt: skip
            again = transition(mi.state, observed)
            if again is not None:  # straight back to ACTIVE: coordinators see RESUME, not DEL + ADD
                mi = replace(mi, state=again, reason=why, state_changed_at=self._wall())
            self.signals[mi.id] = observed
            await self.store.put(f"{KEYS.INSTANCE}{mi.id}", codec.encode_instance(mi))
            self.instances[mi.id] = mi
        log.info("instance state", extra={"instance_id": instance_id, "to": mi.state.value, "reason": mi.reason})
        self._after_change()
        self.poke()

    async def report_alarm(self, alarm: Alarm) -> bool:
        promoted = alarm.kind is AlarmKind.COORDINATOR_PROMOTED and alarm.action is AlarmAction.RAISE
        # With no configured coordinator there is nobody to ask: announcements are the only way
        # to find the master (logged as a risk at start; docs/ha.md).
        if promoted and self.configured_coordinators and not await self.promotion_confirmed(alarm.address):
            # Push targets receive the operator key: a node key alone must not name one.
            raise Unavailable(
                f"coordinator {alarm.address!r} announced itself master, but no configured coordinator "
                "confirms it (GetReadiness with role MASTER and that advertise address); retry when it does",
                reason="PROMOTION_NOT_CONFIRMED")
        if alarm.action is AlarmAction.RAISE and not self.alarms.is_active(alarm) and len(self.alarms) >= MAX_ACTIVE_ALARMS:
            raise ResourceExhausted(
                f"the controller holds {len(self.alarms)} active alarms, its limit: clear some (ReportAlarm CLEAR, "
                "or TerminateInstance with precision_alarm_clear) before raising new ones", reason="TOO_MANY_ALARMS")
        if promoted:  # the previous master's announcement ends with this term: cleared as any CLEAR is
            for old in self.alarms.other_promotions(alarm):
                await self.report_alarm(replace(old, action=AlarmAction.CLEAR, message=f"superseded by {alarm.address}"))
        # Persisted first, applied to memory only once the store took it: a call the store
        # rejects changes nothing, so its retry (the coordinator's outbox) still finds the change
        # to make and runs its recovery and notification. A CLEAR deletes the key even when
        # nothing is active in memory (idempotent: no record can outlive its CLEAR).
        async with self._alarm_lock:
            key = codec.alarm_store_key(alarm)
            if alarm.action is AlarmAction.RAISE:
                await self.store.put(key, codec.encode_alarm(alarm))
            else:
                await self.store.delete(key)
            changed = self.alarms.report(alarm)
        if promoted:
            await self.on_coordinator_promoted(alarm.address)
        if changed is not None and self.on_alarm is not None:
            self.on_alarm(changed)
        if alarm.action is AlarmAction.RAISE and changed is not None:
            self._start_precision_recovery(changed)
        log.warning("alarm %s", alarm.action.value, extra={"kind": alarm.kind.value, "source": alarm.source,
                                                            "instance_ids": list(alarm.instance_ids)})
        return True

    async def promotion_confirmed(self, address: str) -> bool:
        """Whether a coordinator this controller is configured with says it is master at *address*
        (asked through its configured addresses, concurrently, for at most PROMOTION_CHECK_SEC:
        inside the announcing coordinator's 2 s call timeout)."""
        if not address:
            return False
        configured = [p.client for p in self.pushers if p.client.address in self.configured_coordinators]
        asks = [asyncio.ensure_future(c.master_address()) for c in configured]
        try:  # the first confirmation decides: a frozen coordinator must not hold up its successor's
            for answer in asyncio.as_completed(asks, timeout=PROMOTION_CHECK_SEC):
                if await answer == address:
                    return True
        except TimeoutError:
            pass
        finally:
            for ask in asks:
                ask.cancel()
            await asyncio.gather(*asks, return_exceptions=True)
        return False

    async def on_coordinator_promoted(self, address: str) -> None:
        """A coordinator became master: full SET to it at its own address (a new target if it is
        not configured, replacing any master announced before), retried every
        ``set_retry_interval_sec`` until it succeeds; every channel is re-opened so no connection
        stays pinned to the old master."""
        if address and address != self.announced_master:  # a new coordinator term: the old master is stale
            old = next((p for p in self.pushers if p.client.address == self.announced_master), None)
            if old is not None:
                await self._drop_pusher(old, f"superseded by the newly announced master {address}")
            self.announced_master = None
            if address not in self.configured_coordinators and self.coordinator_factory is not None:
                self.announced_master = address
                self._add_pusher(self.coordinator_factory(address))
                log.info("coordinator target added on promotion", extra={"coordinator": address})
        for pusher in self.pushers:
            pusher.request_full_set(reconnect=True)

    # ---- admin ------------------------------------------------------------------------------

    def get_instance(self, instance_id: int) -> ManagedInstance:
        mi = self.instances.get(instance_id)
        if mi is None:
            raise NotFound(f"instance {instance_id} is not known", reason="INSTANCE_NOT_FOUND")
        return mi

    async def set_paused(self, instance_id: int, paused: bool, reason: str = "") -> ManagedInstance:
        """Operator pause (resume) of *instance_id*, persisted before it is answered; the pushers
        then show it to every coordinator as PAUSED (AVAILABLE). Idempotent."""
        async with self._lock:
            mi = self.get_instance(instance_id)
            nxt = operator_pause.pause(mi, reason, self._wall()) if paused else operator_pause.resume(mi)
            if nxt is None:
                return mi
            await self.store.put(f"{KEYS.INSTANCE}{nxt.id}", codec.encode_instance(nxt))
            self.instances[nxt.id] = nxt
        log.info("instance paused by an operator" if paused else "instance resumed by an operator",
                 extra={"instance_id": instance_id, "reason": nxt.pause_reason})
        self._after_change()
        return nxt

    def nodes_paused_by_nodemanager(self, instance_id: int) -> list[str]:
        """Nodes of *instance_id* whose last heartbeat says their nodemanager holds its own pause."""
        mi = self.get_instance(instance_id)
        return sorted(n for n in mi.node_ids
                      if (ob := self.observations.get(n)) is not None and ob.state is NodeState.PAUSED)

    async def terminate_instance(self, instance_id: int, precision_alarm_clear: bool, reason: str) -> list[str]:
        async with self._lock:
            mi = self.get_instance(instance_id)
            nxt = transition(mi.state, Signal.TERMINATE)
            # Already deleted (a retried call): nothing to stop. Its node ids may by now serve the
            # instance that replaced it (node ids survive a restart), which must not be stopped.
            specs = [self.nodes[n].spec for n in mi.node_ids if n in self.nodes] if nxt is not None else []
            if nxt is not None:
                mi = replace(mi, state=nxt, reason=f"terminated: {reason or 'operator request'}",
                             state_changed_at=self._wall(), routable_until=0.0)
                inc = max(self.incarnations.get(mi.job_name, 0), mi.incarnation + 1)
                await self.store.batch(
                    {
                        f"{KEYS.INSTANCE}{mi.id}": codec.encode_instance(mi),
                        f"{KEYS.JOB}{mi.job_name}": orjson.dumps({"incarnation": inc}),
                    },
                    [f"{KEYS.NODE}{s.node_id}" for s in specs],
                )
                self.instances[mi.id] = mi
                self.incarnations[mi.job_name] = inc
                for s in specs:  # the nodemanagers exit and are rescheduled: they register anew
                    self.nodes.pop(s.node_id, None)
                    self.observations.pop(s.node_id, None)
                    self.start_gates.pop(s.node_id, None)
        self._after_change()
        stopped: list[str] = []

        async def stop(spec: NodeSpec) -> None:
            try:
                await self.node_managers.stop_node(spec.admin_address, f"instance {instance_id} terminated")
                stopped.append(spec.node_id)
            except MotorError as exc:
                log.warning("stop node failed", extra={"node_id": spec.node_id, "error": exc.message})

        await asyncio.gather(*(stop(s) for s in specs))
        if precision_alarm_clear:
            await self._clear_precision(instance_id)
        log.info("instance terminated", extra={"instance_id": instance_id, "stopped": stopped})
        return sorted(stopped)

    def _start_precision_recovery(self, alarm: Alarm) -> bool:
        """Auto-recover *alarm* in the background when it is an active precision alarm and recovery
        is on; one recovery per P/D group at a time. Returns whether a recovery started."""
        ft = self.config.fault_tolerance_config
        if alarm.kind is not AlarmKind.PRECISION or not (ft.enable_fault_tolerance and ft.enable_precision_recovery):
            return False
        group = alarm.key[2]
        if group in self._precision_recoveries:
            return False
        self._precision_recoveries.add(group)
        self._tasks.spawn(self._recover_precision(alarm), name=f"precision-recovery:{group}")
        return True

    async def _recover_precision(self, alarm: Alarm) -> None:
        """Auto-recovery of a precision alarm (SPEC §3.5 path 1): terminate every instance of the
        P/D group (its nodes stop and are rescheduled; the new assembly gets a new id), then record
        the CLEAR (same identity as the raise) and tell every coordinator to drop its state."""
        group = alarm.key[2]
        try:
            log.warning("precision alarm: terminating the P/D group", extra={"instance_ids": list(group)})
            for iid in group:
                mi = self.instances.get(iid)
                if mi is not None and mi.live:
                    try:
                        await self.terminate_instance(iid, False, "precision alarm auto-recovery")
                    except MotorError as exc:
                        log.warning("precision recovery: terminate failed",
                                    extra={"instance_id": iid, "error": exc.message})
            await self._clear_precision(group, "cleared by auto-recovery (P/D group terminated)")
        finally:
            self._precision_recoveries.discard(group)

    async def _clear_precision(self, instance_ids: int | Sequence[int], message: str = "cleared by terminate") -> None:
        wanted = [instance_ids] if isinstance(instance_ids, int) else list(instance_ids)
        async with self._alarm_lock:  # deleted from the store first, as report_alarm does
            keys = sorted({codec.alarm_store_key(a) for iid in wanted for a in self.alarms.active_precision(iid)})
            if keys:
                await self.store.batch({}, keys)
            cleared = [a for iid in wanted for a in self.alarms.clear_precision(iid, message)]
        if self.on_alarm is not None:
            for a in cleared:
                self.on_alarm(a)
        ids = sorted({i for a in cleared for i in a.instance_ids} | set(wanted))
        for pusher in self.pushers:
            try:
                await pusher.client.clear_precision_alarms(ids)
            except MotorError as exc:
                log.warning("clear precision alarms failed", extra={"coordinator": pusher.client.address,
                                                                    "error": exc.message})

    # ---- reconcile --------------------------------------------------------------------------

    def desired_view(self) -> dict[int, Instance]:
        return desired_view(self.instances.values(), self.signals, wall=self._wall())

    def _note_routed_without_node(self, wall: float) -> None:
        """Log (once each) an instance kept in routing with a node lost, and when it no longer is."""
        now = {mi.id: mi.routable_until for mi in self.instances.values()
               if kept_without_node(mi, self.signals.get(mi.id), wall)}
        for iid, until in now.items():
            if self.routed_without_node.get(iid) == until:
                continue
            mi = self.instances[iid]
            lost = [n for n in mi.node_ids if not self.is_alive(n)]
            log.warning(
                "instance %d kept in routing with its node %s lost, until %s (node_lost_routing_grace_sec); the "
                "coordinators judge its engines meanwhile", iid, ", ".join(lost) or "(re-attaching)",
                datetime.fromtimestamp(until, UTC).isoformat(timespec="seconds"),
                extra={"instance_id": iid, "job": mi.job_name, "nodes": lost, "routable_until": until,
                       "reason": mi.reason},
            )
        for iid in self.routed_without_node.keys() - now.keys():
            gone = self.instances.get(iid)
            sig = self.signals.get(iid)
            if gone is None:
                why = "forgotten"
            elif gone.state is InstanceState.INACTIVE and gone.routable_until and wall >= gone.routable_until:
                why = "its routing grace (node_lost_routing_grace_sec) ended"
            else:
                why = f"now {gone.state.value}, signal {sig.value if sig else 'none'}: {gone.reason}"
            log.warning("instance %d no longer kept in routing without its node: %s", iid, why,
                        extra={"instance_id": iid, "why": why})
        self.routed_without_node = now

    def _after_change(self) -> None:
        wall = self._wall()
        self._note_routed_without_node(wall)
        fp = fingerprint(desired_view(self.instances.values(), self.signals, wall=wall))
        if fp != self._desired_fp:
            self._desired_fp = fp
            for pusher in self.pushers:
                pusher.poke()

    async def reconcile_once(self) -> None:
        async with self._lock:
            world = World(
                nodes=self.nodes,
                observations=self.observations,
                instances=self.instances,
                incarnations=self.incarnations,
                start_gates=self.start_gates,
                now=self._clock(),
                wall=self._wall(),
                reattach_until=self.reattach_until,
                heartbeat_timeout=self.config.heartbeat_timeout_sec,
                master_port=self.config.dp_master_port,
                node_lost_routing_grace=self.config.node_lost_routing_grace_sec,
            )
            p = plan(world)
            if p.upserts or p.incarnations:
                puts = {f"{KEYS.INSTANCE}{i}": codec.encode_instance(mi) for i, mi in p.upserts.items()}
                puts.update({f"{KEYS.JOB}{j}": orjson.dumps({"incarnation": n}) for j, n in p.incarnations.items()})
                await self.store.batch(puts)
                for iid, mi in p.upserts.items():
                    old = self.instances.get(iid)
                    if old is None or old.state is not mi.state:
                        log.info(
                            "instance state",
                            extra={"instance_id": iid, "job": mi.job_name, "from": old.state.value if old else None,
                                   "to": mi.state.value, "reason": mi.reason},
                        )
                self.instances.update(p.upserts)
                self.incarnations.update(p.incarnations)
            self.signals = p.signals
            forget = deleted_to_forget(self.instances, MAX_DELETED_KEPT)
            if forget:
                await self.store.batch({}, [f"{KEYS.INSTANCE}{i}" for i in forget])
                for iid in forget:
                    del self.instances[iid]
                    self.fault_manager.forget(iid)
                log.info("forgot the oldest deleted instances", extra={"instance_ids": forget, "kept": MAX_DELETED_KEPT})
            if self.config.fault_tolerance_config.enable_fault_tolerance:
                for iid, survivors in p.partial_losses.items():
                    if iid not in self.fault_manager.running:
                        self._tasks.spawn(self.fault_manager.on_partial_loss(iid, survivors), name=f"partial-loss-{iid}")
            now = self._clock()
            for cmd in p.starts:
                self.start_gates[cmd.node_id] = (cmd.instance_id, now + self.config.start_retry_interval_sec)
                self._tasks.spawn(self._send_start(cmd), name=f"start:{cmd.node_id}")
        self._after_change()

    async def _send_start(self, cmd: StartCommand) -> None:
        self.starts_sent.append(cmd)
        del self.starts_sent[:-1000]
        try:
            await self.node_managers.start_engines(cmd)
            log.info("start command sent", extra={"node_id": cmd.node_id, "instance_id": cmd.instance_id})
        except MotorError as exc:
            self.start_gates[cmd.node_id] = (cmd.instance_id, self._clock() + START_FAILURE_BACKOFF)
            log.warning("start command failed, will retry",
                        extra={"node_id": cmd.node_id, "instance_id": cmd.instance_id, "error": exc.message})

    async def _reconcile_loop(self) -> None:
        interval = self.config.reconcile_interval_sec
        while True:
            self._wake.clear()
            try:
                await self.reconcile_once()
            except Exception:
                log.exception("reconcile failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._wake.wait()
