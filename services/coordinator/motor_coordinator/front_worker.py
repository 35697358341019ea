"""A co-located front worker (``http.workers`` > 1): one of N processes serving the coordinator's
OpenAI front on one port (``SO_REUSEPORT``), started and restarted by the coordinator
(``front_workers.py``).

Each worker dispatches itself: its own scheduler, engine client, dispatcher, engine probes and
KV-event subscriptions (``data_plane.DataPlane``), so the engine calls, the KV hand-off and the
relay of the answers, the heavier half of a request, are spread over the workers' cores. What
must be the same in every worker comes from the coordinator on one ``FrontWorkerService/Sync``
stream (``front_sync.py``): the instance set, leadership and precision alarms, and the other
workers' in-flight work per engine, which the worker's scheduler adds to its own (least load, the
prefix policy's load guard and the KV-event policy's queued tokens see the whole front). The
prefix ring is the same in every worker because it is built from the same instance set.

Without its stream (the coordinator restarting it) a worker keeps serving with what it last
received and reconnects; before its first instance set it is not ready (REGISTRY_NOT_SYNCED).

    python -m motor_coordinator.front_worker --config-json FILE --sync unix:PATH --board FILE \\
        --port P --ports-file F --worker-dir D --worker-index I --worker-count N
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from types import MappingProxyType

import grpc

from motor_common.config import load_config
from motor_common.convert import instance_from_pb
from motor_common.domain import Instance
from motor_common.gen.motor.coordinator.v1 import front_worker_pb2 as fpb
from motor_common.gen.motor.coordinator.v1 import front_worker_pb2_grpc as fgrpc
from motor_common.leadership import LeaderRole
from motor_common.logs import setup_logging
from motor_common.openai_front.app import read_api_key
from motor_common.runner import run, stop_event_on_signals, write_ports_file
from motor_common.tasks import TaskOwner
from motor_common.tls import https_context
from motor_common.tracing import reset_tracing, setup_tracing
from motor_common.worker_policy import admission_share
from motor_common.worker_supervisor import beat_forever, worker_registry
from motor_coordinator.config import CoordinatorConfig
from motor_coordinator.data_plane import DataPlane
from motor_coordinator.front_sync import MAX_MESSAGE_BYTES, ROLE_FROM_PB
from motor_coordinator.front_workers import WORKER_NAMES
from motor_coordinator.http_front import CoordinatorBackend, HttpFront
from motor_coordinator.load_board import LoadBoard, endpoint_keys
from motor_coordinator.readiness import Readiness, evaluate
from motor_coordinator.registry import RegistryState
from motor_coordinator.state_metrics import CoordinatorCollector

log = logging.getLogger("motor_coordinator.front_worker")

RECONNECT_MIN_SEC = 0.05
RECONNECT_MAX_SEC = 1.0


class MirroredLeadership:
    """The coordinator's leadership as its last Sync message said (``leadership.Leadership``).

    A master's view holds until the bound the message gave (``master_valid_until``, renewed at
    every lease renewal): past it the worker reads the master as isolated, like the coordinator
    itself, so a worker of a frozen or starved master stops serving before a standby can take
    over (at most one ready master, the front workers included)."""

    def __init__(self) -> None:
        self.role = LeaderRole.STANDALONE
        self._isolated = False
        self.store_available = True
        self.valid_until = 0.0  # monotonic (the coordinator's clock: the same host); 0: no bound
        self.holder = ""  # not mirrored: a worker's NOT_MASTER refusal does not name the master
        # Until the coordinator said who it is, this worker does not serve (not master).
        self.known = False
        self._listeners: list[Callable[[], None]] = []

    @property
    def is_master(self) -> bool:
        return self.known and self.role in (LeaderRole.STANDALONE, LeaderRole.MASTER)

    @property
    def isolated(self) -> bool:
        return self._isolated or (self.valid_until != 0 and time.monotonic() > self.valid_until)

    def subscribe(self, on_change: Callable[[], None]) -> None:
        self._listeners.append(on_change)

    def set(self, role: LeaderRole, isolated: bool, store_available: bool, valid_until: float = 0.0) -> None:
        self.role, self._isolated, self.store_available, self.known = role, isolated, store_available, True
        self.valid_until = valid_until
        for listener in self._listeners:
            listener()


def registry_from_pb(msg: fpb.FrontWorkerRegistry) -> RegistryState:
    instances: dict[int, Instance] = {}
    for i, m in enumerate(msg.instances):
        inst = instance_from_pb(m, f"registry.instances[{i}]", keep_status=True)
        instances[inst.id] = inst
    return RegistryState(msg.generation, MappingProxyType(instances), msg.authoritative, msg.managed)


class FrontWorker:
    """One worker's state and life cycle (what ``CoordinatorBackend`` and the state metrics read)."""

    def __init__(self, cfg: CoordinatorConfig, *, index: int, count: int, sync_target: str,
                 board: LoadBoard, coordinator_address: str = "") -> None:
        self.cfg = cfg
        self.index = index
        self.count = count
        self.sync_target = sync_target
        self.address = coordinator_address
        self.plane = DataPlane(cfg)
        self.scheduler = self.plane.scheduler
        self.dispatcher = self.plane.dispatcher
        self.monitor = self.plane.monitor
        self.kv_index = self.plane.kv_index
        self.kv_events = self.plane.kv_events
        self.policy = self.plane.policy
        self.leadership = MirroredLeadership()
        self.state = RegistryState()
        self._model_created: dict[str, int] = {}
        self.board = board
        self.scheduler.on_load_change = board.write
        self.scheduler.peer_source = lambda force: board.others(force=force)
        self.tasks = TaskOwner(f"front-worker-{index}")
        self.http: HttpFront | None = None

    # -- what the front reads ----------------------------------------------------------------

    def model_created(self, model: str) -> int:
        return self._model_created.get(model, 0)

    def readiness(self) -> Readiness:
        return evaluate(is_master=self.leadership.is_master, isolated=self.leadership.isolated,
                        schedulable=self.scheduler.has_schedulable_route(), synced=self.state.authoritative)

    # -- the coordinator's state --------------------------------------------------------------

    def apply(self, msg: fpb.SyncResponse) -> None:
        if msg.HasField("registry"):
            state = registry_from_pb(msg.registry)
            self.plane.accept(state)
            self.board.set_endpoints(endpoint_keys(state.instances.values()), own=self.scheduler.own_loads())
            self.state = state
            now = int(time.time())
            for inst in state.instances.values():
                self._model_created.setdefault(inst.model_name, now)
        if msg.HasField("leadership"):
            lead = msg.leadership
            self.leadership.set(ROLE_FROM_PB.get(lead.role, LeaderRole.STANDBY), lead.isolated, lead.store_available,
                                lead.master_valid_until)
        if msg.HasField("alarms"):
            self.scheduler.set_alarmed(frozenset(tuple(g.instance_ids) for g in msg.alarms.groups))

    async def _hello(self) -> AsyncIterator[fpb.SyncRequest]:
        """Who this worker is; then the stream stays open (its end tells the coordinator the
        worker is gone)."""
        yield fpb.SyncRequest(worker_index=self.index)
        await asyncio.Event().wait()

    async def _sync_forever(self) -> None:
        delay = RECONNECT_MIN_SEC
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
        while True:
            try:
                async with grpc.aio.insecure_channel(self.sync_target, options=options) as channel:
                    call = fgrpc.FrontWorkerServiceStub(channel).Sync(self._hello())
                    async for msg in call:
                        self.apply(msg)
                        delay = RECONNECT_MIN_SEC
                log.warning("the coordinator ended this worker's sync stream; reconnecting",
                            extra={"worker": self.index})
            except grpc.aio.AioRpcError as exc:
                log.warning("sync stream to the coordinator failed; serving with the last state received, "
                            "reconnecting", extra={"worker": self.index, "code": exc.code().name,
                                                   "retry_in_sec": delay})
            except Exception:  # a message it could not apply: a new stream starts with everything in full
                log.exception("sync stream to the coordinator: a message could not be applied; serving with "
                              "the last state applied, reconnecting", extra={"worker": self.index})
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX_SEC)

    # -- life cycle ---------------------------------------------------------------------------

    async def start(self, *, port: int, worker_dir: str | None) -> int:
        cfg, h = self.cfg, self.cfg.http
        await self.plane.client.start()
        self.plane.watch_loop(self.tasks, log)
        self.tasks.spawn(self._sync_forever(), name="front-sync")
        self.plane.watch_engines(self.tasks)
        registry = None
        if worker_dir is not None:
            self.tasks.spawn(beat_forever(worker_dir, self.index), name="heartbeat")
            registry = worker_registry(worker_dir, WORKER_NAMES)
            registry.register(CoordinatorCollector(self))
        self.http = HttpFront(CoordinatorBackend(self), h.host, port,
                              request_timeout=cfg.dispatch.request_timeout_sec,
                              api_key=read_api_key(h.api_key_file), shutdown_timeout=h.shutdown_grace_sec,
                              ssl_context=https_context(h.tls) if h.tls.serves_tls else None,
                              limits=h.limits, admission=admission_share(h.admission, self.index, self.count),
                              reuse_port=True, metrics_registry=registry)
        return await self.http.start()

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.stop()  # drains the requests in flight (http.shutdown_grace_sec)
        await self.tasks.close()
        await self.plane.close()
        self.board.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="motor_coordinator.front_worker",
                                description="A coordinator's co-located front worker (started by the coordinator).")
    p.add_argument("--config-json", required=True, help="the coordinator's effective configuration")
    p.add_argument("--sync", required=True, help="the coordinator's FrontWorkerService (unix:PATH)")
    p.add_argument("--board", required=True, help="the coordinator's load board file (load_board.py)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ports-file", required=True)
    p.add_argument("--worker-dir", required=True)
    p.add_argument("--worker-index", type=int, required=True)
    p.add_argument("--worker-count", type=int, required=True)
    p.add_argument("--coordinator-address", default="")
    return p.parse_args(argv)


async def amain(args: argparse.Namespace) -> int:
    cfg = load_config(CoordinatorConfig, args.config_json)
    setup_logging("coordinator", cfg.log.level, cfg.log.format)
    setup_tracing(cfg.tracing, "coordinator")
    stop = stop_event_on_signals()
    board = LoadBoard(args.board, args.worker_count, args.worker_index)
    worker = FrontWorker(cfg, index=args.worker_index, count=args.worker_count, sync_target=args.sync,
                         board=board, coordinator_address=args.coordinator_address)
    try:
        port = await worker.start(port=args.port, worker_dir=args.worker_dir)
        write_ports_file(args.ports_file, {"http": port})
        log.info("front worker serving", extra={"worker": args.worker_index, "http_port": port})
        await stop.wait()
        log.info("front worker stopping", extra={"worker": args.worker_index})
    finally:
        await worker.stop()
        reset_tracing()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run(lambda: amain(args))


if __name__ == "__main__":
    raise SystemExit(main())
