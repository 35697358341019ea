"""The coordinator process wiring: registry mirror, scheduler, dispatcher, gRPC, readiness."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable

from prometheus_client import REGISTRY

from motor_common.credentials import Role
from motor_common.domain import Instance
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_server import GrpcServer
from motor_common.openai_front.app import read_api_key
from motor_common.ops_http import OpsHttpServer, ops_server
from motor_common.ports import host_port
from motor_common.request_limits import MAX_BYTES
from motor_common.tasks import TaskOwner
from motor_common.tls import https_context
from motor_coordinator.config import CoordinatorConfig
from motor_coordinator.data_plane import DataPlane
from motor_coordinator.dispatch_service import SERVICE_NAME as DISPATCH_SERVICE
from motor_coordinator.dispatch_service import DispatchServicer
from motor_coordinator.election import EtcdLeadership
from motor_coordinator.front_sync import FrontSync
from motor_coordinator.front_workers import FrontWorkers
from motor_coordinator.http_front import CoordinatorBackend, HttpFront
from motor_coordinator.leadership import Leadership, Standalone, campaign_hold
from motor_coordinator.load_board import endpoint_keys
from motor_coordinator.precision_monitor import PrecisionMonitor
from motor_coordinator.promotion import ControllerAlarms, PromotionAnnouncer
from motor_coordinator.readiness import Readiness, evaluate
from motor_coordinator.registry import RegistryState
from motor_coordinator.registry_service import SERVICE_NAME as REGISTRY_SERVICE
from motor_coordinator.registry_service import RegistryServicer, observed
from motor_coordinator.state_metrics import CoordinatorCollector

log = logging.getLogger(__name__)


class Coordinator:
    def __init__(
        self,
        cfg: CoordinatorConfig,
        *,
        leadership: Leadership | None = None,
        management_key: str | None = None,
    ) -> None:
        self.cfg = cfg
        if leadership is None:
            leadership = EtcdLeadership(cfg) if cfg.ha.enabled else Standalone()
        self.leadership: Leadership = leadership
        self.announcer: PromotionAnnouncer | None = None
        self.address = ""
        self.plane = DataPlane(cfg)
        self.kv_index = self.plane.kv_index
        self.kv_events = self.plane.kv_events
        self.tokenize_offload = self.plane.tokenize_offload
        self.policy = self.plane.policy
        self.stall_clock = self.plane.stall_clock
        self.scheduler = self.plane.scheduler
        self.client = self.plane.client
        self.dispatcher = self.plane.dispatcher
        self.monitor = self.plane.monitor
        self.precision = PrecisionMonitor(
            cfg.precision, cfg.precision_clear_threshold, self.scheduler, self.dispatcher,
            is_master=lambda: self.leadership.is_master and not self.leadership.isolated,
            controller_address=cfg.controller_address,
        )
        # The management mirror: swapped only after the scheduler accepted the same snapshot.
        self.state = RegistryState()
        self._model_created: dict[str, int] = {}
        # Dispatch carries whole request bodies: up to request_limits.MAX_BYTES (64 MiB).
        self.server = GrpcServer("coordinator", cfg.server, management_key=management_key,
                                 inference_keys_file=cfg.http.api_key_file, max_message_bytes=MAX_BYTES)
        self.server.add_service(
            REGISTRY_SERVICE,
            lambda s: cgrpc.add_InstanceRegistryServiceServicer_to_server(
                RegistryServicer(self), s
            ),
            protected=True,
            # The controller's full instance set: ~27 fields per instance, 10 000 instances allowed.
            max_request_fields=None,
        )
        self.server.add_service(
            DISPATCH_SERVICE,
            lambda s: cgrpc.add_DispatchServiceServicer_to_server(
                DispatchServicer(self), s
            ),
            # With inference keys configured, Dispatch and ListModels need one (the gateway's own
            # or a client's); readiness stays open for the gateways' probes.
            role=Role.INFERENCE, open_methods=("GetReadiness",),
        )
        self.tasks = TaskOwner("coordinator")
        self.ops: OpsHttpServer | None = None
        self._collector: CoordinatorCollector | None = None
        self.http: HttpFront | None = None
        # http.workers > 1: the front's worker processes, and what they mirror (front_workers.py)
        self.front_sync: FrontSync | None = None
        self.front: FrontWorkers | None = None
        if cfg.http.enabled and cfg.http.workers > 1:
            sync = self.front_sync = FrontSync(lambda: self.state, self.leadership, lambda: self.scheduler.alarmed)
            self.scheduler.on_alarmed = sync.alarms_changed
            self.leadership.subscribe(sync.leadership_changed)
            self.front = FrontWorkers(cfg, sync)
            board = self.front.board
            # this process counts the front's load too (its own Dispatch, /metrics)
            self.scheduler.peer_source = lambda force: board.others(force=force)
        self._dirty: asyncio.Event | None = None
        self._serving: bool | None = None
        self.scheduler.subscribe(self._mark_dirty)
        self.leadership.subscribe(self._mark_dirty)

    # -- registry ----------------------------------------------------------------------------

    def commit(self, new: RegistryState) -> None:
        """Scheduler first, then the mirror: no await between validation and this call."""
        self.plane.accept(new)
        became_authoritative = new.authoritative and not self.state.authoritative
        self.state = new
        if self.front is not None:
            self.front.board.set_endpoints(endpoint_keys(new.instances.values()))
        if self.front_sync is not None:
            self.front_sync.registry_changed()
        if became_authoritative:
            log.info("instance registry is authoritative", extra={"generation": new.generation,
                                                                   "instances": len(new.instances)})
            self._mark_dirty()
        now = int(time.time())
        for inst in new.instances.values():
            self._model_created.setdefault(inst.model_name, now)

    def observed(self, inst: Instance) -> Instance:
        return observed(inst, self.scheduler.instance_unavailable(inst))

    def observed_instances(self) -> list[Instance]:
        return [self.observed(i) for i in self.state.instances.values()]

    @property
    def http_port(self) -> int | None:
        """The co-located front's port (in this process or its workers'), None without one."""
        if self.http is not None:
            return self.http.port
        return self.front.port if self.front is not None else None

    def model_created(self, model: str) -> int:
        return self._model_created.get(model, 0)

    def clear_precision_alarms(self, ids: Iterable[int]) -> int:
        return self.precision.clear(ids)

    # -- readiness ---------------------------------------------------------------------------

    def readiness(self) -> Readiness:
        return evaluate(
            is_master=self.leadership.is_master,
            isolated=self.leadership.isolated,
            schedulable=self.scheduler.has_schedulable_route(),
            synced=self.state.authoritative,
        )

    def _mark_dirty(self) -> None:
        if self._dirty is not None:
            self._dirty.set()

    async def _apply_readiness(self) -> None:
        r = self.readiness()
        if r.ready != self._serving:
            self._serving = r.ready
            await self.server.set_serving(r.ready, "")
            await self.server.set_serving(r.ready, DISPATCH_SERVICE)
            log.info("readiness changed", extra={"ready": r.ready, "reason": r.reason})

    async def _readiness_loop(self) -> None:
        assert self._dirty is not None
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            await self._apply_readiness()

    async def _ops_readiness(self) -> tuple[bool, str]:
        r = self.readiness()
        return r.ready, r.reason or "ok"

    # -- life cycle --------------------------------------------------------------------------

    async def start(self) -> int:
        """Start everything; a failure (a busy port: ConfigError) stops what had started, so the
        process exits with its one-line error and nothing else."""
        try:
            return await self._start()
        except BaseException:
            with contextlib.suppress(Exception):
                await self.stop(0)
            raise

    async def _start(self) -> int:
        await self.client.start()
        port = await self.server.start()
        self.address = self.cfg.ha.advertise_address or host_port(self.cfg.server.host, port)
        self._dirty = asyncio.Event()
        self.plane.watch_loop(self.tasks, log)
        await self._apply_readiness()
        await self._start_election()
        self.precision.start(self.address, self.server.client_key, self.cfg.server.tls)
        self.tasks.spawn(self._readiness_loop(), name="readiness")
        self.plane.watch_engines(self.tasks)
        self.ops = ops_server(self.cfg.server, self._ops_readiness)
        if self.ops is not None:
            await self.ops.start()
        h = self.cfg.http
        if self.ops is not None or h.enabled:
            # The registry, election and KV-index state, on every /metrics this process serves:
            # the ops port's and the co-located front's (which may be the only one).
            self._collector = CoordinatorCollector(self)
            REGISTRY.register(self._collector)
        if self.front is not None:
            await self.front.start(self.address)
        elif h.enabled:
            assert h.port is not None
            self.http = HttpFront(CoordinatorBackend(self), h.host, h.port, request_timeout=self.cfg.dispatch.request_timeout_sec,
                                  api_key=read_api_key(h.api_key_file), shutdown_timeout=h.shutdown_grace_sec,
                                  ssl_context=https_context(h.tls) if h.tls.serves_tls else None,
                                  limits=h.limits, admission=h.admission)
            await self.http.start()
        return port

    async def _start_election(self) -> None:
        """HA: campaign (the registry and the engine probes already run: a standby stays warm)."""
        lead = self.leadership
        if not isinstance(lead, EtcdLeadership):
            return
        if self.cfg.controller_address:
            sink = ControllerAlarms(self.cfg.controller_address, management_key=self.server.client_key,
                                    timeout=2.0, tls=self.cfg.server.tls)
            announcer = self.announcer = PromotionAnnouncer(sink, self.address)
            lead.on_promoted(lambda view: announcer.promoted(view.term))
            lead.on_demoted(lambda _: announcer.cancel())
        started, delay = time.monotonic(), self.cfg.ha.unsynced_campaign_delay_sec
        await lead.start(self.cfg.ha.candidate_id or self.address, lambda: campaign_hold(
            synced=self.state.authoritative, waited=time.monotonic() - started, delay=delay))

    async def stop(self, grace: float | None = None) -> None:
        if isinstance(self.leadership, EtcdLeadership):
            # Resign first: the standby takes over while our in-flight requests finish.
            await self.leadership.stop()
            await self._apply_readiness()
        if self.announcer is not None:
            await self.announcer.close()
        if self.http is not None:
            await self.http.stop()
        if self.front is not None:
            await self.front.stop()
        await self.server.stop(grace)
        await self.tasks.close()
        await self.precision.close()
        if self.ops is not None:
            await self.ops.stop()
        if self._collector is not None:
            REGISTRY.unregister(self._collector)
            self._collector = None
        await self.plane.close()
