"""Precision monitor (SPEC §3.5): probe every P/D group, raise/clear precision alarms.

Every ``precision.interval_sec`` (master only) one round sends each configured prompt
(temperature 0, fixed seed, non-streamed) to every P/D group through the dispatcher's normal
handoff pinned to that pair (:class:`~motor_coordinator.precision_routing.PinnedScheduler`), then
feeds the answers to the pure :class:`~motor_coordinator.precision.PrecisionTracker`. Alarm events
go to an outbox that reports them to the controller (``ReportAlarm`` through
:class:`~motor_coordinator.promotion.ControllerAlarms`, the promotion alarm's client), in order,
retried every ``report_retry_interval_sec`` until accepted. The alarmed groups are handed to the
scheduler (avoided when possible) and exported as the ``motor_coordinator_precision_alarm`` gauge.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from typing import Any, cast

import aiohttp
import grpc
import orjson
from prometheus_client import Counter, Gauge

from motor_common.credentials import Credential
from motor_common.errors import MotorError
from motor_common.gen.motor.controller.v1 import controller_pb2 as ctl
from motor_common.tasks import TaskOwner
from motor_common.tls import TlsConfig
from motor_coordinator.dispatcher import Dispatcher, Frame, Head
from motor_coordinator.policies import Candidate
from motor_coordinator.precision import (
    Action,
    AlarmEvent,
    Group,
    PrecisionTracker,
    ProbeGroup,
    Sample,
    classify,
    combine,
    extract_text,
    learn_expected,
    probe_groups,
)
from motor_coordinator.precision_config import PrecisionConfig, PrecisionPrompt
from motor_coordinator.precision_routing import PinnedScheduler, PrecisionAwareScheduler
from motor_coordinator.promotion import AlarmSink, ControllerAlarms
from motor_coordinator.request import CHAT, COMPLETIONS, ParsedRequest
from motor_coordinator.scheduler import Route

log = logging.getLogger(__name__)

# Bytes of a probe's answer held: it asks for a JSON answer of a few tokens (max_tokens); an
# engine that answers with more (an endless stream) gives no answer instead of filling memory
# until the probe's timeout.
MAX_ANSWER_BYTES = 1 << 20

ALARM_GAUGE = Gauge(
    "motor_coordinator_precision_alarm",
    "1 while the P/D group (instance ids 'p-d', or 'u' for a union instance) has an active precision alarm",
    ["group"],
)
SAMPLES = Counter("motor_coordinator_precision_samples", "Precision samples per P/D group round", ["result"])


def group_label(group: Group) -> str:
    return "-".join(str(i) for i in group)


def alarm_to_pb(ev: AlarmEvent, address: str) -> ctl.Alarm:
    alarm = ctl.Alarm(
        kind=ctl.ALARM_KIND_PRECISION,
        action=ctl.ALARM_ACTION_RAISE if ev.action is Action.RAISE else ctl.ALARM_ACTION_CLEAR,
        source=ev.identity.source,
        instance_ids=list(ev.identity.instance_ids),
        address=address,
        message=ev.message,
    )
    alarm.raised_at.GetCurrentTime()
    return alarm


class AlarmOutbox:
    """Alarm events in order, each retried until the controller accepts it."""

    def __init__(self, sink: AlarmSink, address: str, retry_interval: float) -> None:
        self.sink = sink
        self.address = address
        self.retry_interval = retry_interval
        self.delivered: list[AlarmEvent] = []
        self._queue: deque[AlarmEvent] = deque()
        self._wake = asyncio.Event()

    def put(self, ev: AlarmEvent) -> None:
        self._queue.append(ev)
        self._wake.set()

    def drop(self, groups: Iterable[Group]) -> None:
        """Forget pending reports of *groups* (the controller cleared them itself)."""
        gone = set(groups)
        self._queue = deque(e for e in self._queue if e.identity.instance_ids not in gone)

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def run(self) -> None:
        attempt = 0
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                ev = self._queue[0]
                attempt += 1
                try:
                    ok = await self.sink.report(alarm_to_pb(ev, self.address))
                except grpc.aio.AioRpcError as exc:
                    ok = False
                    if attempt == 1 or attempt % 30 == 0:
                        log.warning("precision alarm report failed (%s: %s); retrying every %.3gs",
                                    exc.code().name, exc.details(), self.retry_interval)
                if ok:
                    if self._queue and self._queue[0] is ev:
                        self._queue.popleft()
                    self.delivered.append(ev)
                    del self.delivered[:-100]
                    attempt = 0
                    log.info("precision alarm %s reported", ev.action.value,
                             extra={"instance_ids": list(ev.identity.instance_ids)})
                else:
                    await asyncio.sleep(self.retry_interval)


class PrecisionMonitor:
    def __init__(
        self,
        cfg: PrecisionConfig,
        clear_threshold: int,
        scheduler: PrecisionAwareScheduler,
        dispatcher: Dispatcher,
        *,
        is_master: Callable[[], bool],
        controller_address: str | None,
    ) -> None:
        self.cfg = cfg
        self.clear_threshold = clear_threshold
        self.scheduler = scheduler
        self.dispatcher = dispatcher
        self.is_master = is_master
        self.controller_address = controller_address
        self.tracker = PrecisionTracker("coordinator@", clear_threshold)
        self.outbox: AlarmOutbox | None = None
        self.expected: list[str | None] = [p.expected for p in cfg.prompts]
        self.rounds = 0
        self._cleared_in: dict[Group, int] = {}
        self._labels: set[str] = set()
        self._tasks = TaskOwner("precision")
        self._controller: ControllerAlarms | None = None
        # active precision alarms at the controller to adopt (sorted instance ids -> their source),
        # fetched on becoming master; None = to fetch
        self._adoptable: dict[tuple[int, ...], str] | None = None

    # -- life cycle --------------------------------------------------------------------------

    def start(self, address: str, management_key: Credential, tls: TlsConfig | None = None) -> None:
        """Start probing (when enabled) and reporting (when a controller is configured)."""
        self.tracker = PrecisionTracker(f"coordinator@{address}", self.clear_threshold)
        if self.controller_address:
            sink = ControllerAlarms(self.controller_address, management_key=management_key,
                                    timeout=self.cfg.report_timeout_sec, tls=tls)
            self._controller = sink
            self.outbox = AlarmOutbox(sink, address, self.cfg.report_retry_interval_sec)
            self._tasks.spawn(self.outbox.run(), name="precision-reports")
        if self.cfg.enabled:
            self._tasks.spawn(self._loop(), name="precision-probes")
            log.info("precision monitor started",
                     extra={"interval_sec": self.cfg.interval_sec, "prompts": len(self.cfg.prompts),
                            "clear_threshold": self.clear_threshold, "controller": self.controller_address})

    async def close(self) -> None:
        await self._tasks.close()
        if self.outbox is not None:
            await self.outbox.sink.close()

    async def _loop(self) -> None:
        was_master = False
        while True:
            master = self.is_master()
            if master:
                if not was_master:
                    self._adoptable = None  # each term: what the controller holds active now
                try:
                    if self._adoptable is None:
                        await self.fetch_adoptable()
                    await self.run_round()
                except Exception:
                    log.exception("precision probe round failed")
            was_master = master
            await asyncio.sleep(self.cfg.interval_sec)

    async def fetch_adoptable(self) -> None:
        """The precision alarms the controller holds active — raised by this coordinator before a
        restart (perhaps at another address) or by the master before a failover — to adopt: their
        groups count as alarmed here and are cleared, under their own identity, once they sample
        normal again. Without this such an alarm stayed active for ever. A failed fetch is retried
        next round; probing goes on meanwhile."""
        if self._controller is None:
            self._adoptable = {}
            return
        try:
            active = await self._controller.active(ctl.ALARM_KIND_PRECISION)
        except grpc.aio.AioRpcError as exc:
            log.warning("could not list the controller's active precision alarms (%s: %s); retrying next round",
                        exc.code().name, exc.details())  # fmt: skip
            return
        self._adoptable = {tuple(sorted(a.instance_ids)): a.source for a in active if a.instance_ids}
        if self._adoptable:
            log.info("active precision alarms to adopt", extra={"groups": [list(g) for g in self._adoptable]})

    # -- external clear (controller ClearPrecisionAlarms) -------------------------------------

    def clear(self, instance_ids: Iterable[int]) -> int:
        dropped = self.tracker.drop(instance_ids)
        for g in dropped:
            self._cleared_in[g] = self.rounds  # answers of a round already running are stale
        if self.outbox is not None:
            self.outbox.drop(dropped)
        self._publish()
        if dropped:
            log.info("precision alarms dropped on the controller's request",
                     extra={"groups": [list(g) for g in dropped]})
        return len(dropped)

    # -- one round ---------------------------------------------------------------------------

    async def run_round(self) -> list[AlarmEvent]:
        self.rounds += 1
        this_round = self.rounds
        state = self.scheduler.state
        self.tracker.retain(state.instances)
        groups = probe_groups(state.instances.values())
        adoptable = self._adoptable or {}
        for g in groups:
            source = adoptable.pop(tuple(sorted(g.ids)), None)
            if source is not None and self.tracker.adopt(g.ids, source):
                log.warning("precision alarm adopted: the group counts as alarmed until it samples normal",
                            extra={"instance_ids": list(g.ids), "source": source})
        sem = asyncio.Semaphore(self.cfg.concurrency)

        async def one(g: ProbeGroup) -> list[str | None]:
            async with sem:
                return [await self.probe(g, p) for p in self.cfg.prompts]

        answers = await asyncio.gather(*(one(g) for g in groups))
        for i, prompt in enumerate(self.cfg.prompts):
            if self.expected[i] is None:
                self.expected[i] = learn_expected(a[i] for a in answers)
                if self.expected[i] is not None:
                    log.info("precision expected answer learned",
                             extra={"prompt": prompt.prompt or "messages", "expected": self.expected[i]})
        registered = self.scheduler.state.instances
        events: list[AlarmEvent] = []
        for g, ans in zip(groups, answers, strict=True):
            if self._cleared_in.get(g.ids, 0) >= this_round or not all(i in registered for i in g.ids):
                continue
            samples = [classify(a, self.expected[i]) for i, a in enumerate(ans)]
            sample = combine(samples)
            SAMPLES.labels(result=sample.value).inc()
            ev = self.tracker.observe(g.ids, sample, _detail(samples, ans, self.expected))
            if ev is None:
                continue
            events.append(ev)
            if self.outbox is not None:
                self.outbox.put(ev)
            log.warning("precision alarm %s", ev.action.value,
                        extra={"instance_ids": list(g.ids), "detail": ev.message})
        self._cleared_in = {g: r for g, r in self._cleared_in.items() if r >= this_round}
        self._publish()
        return events

    def _route(self, g: ProbeGroup) -> Route | None:
        """The group's route: the first endpoint (by id) of each instance that is in rotation."""

        def cand(inst: Any) -> Candidate | None:
            for ep in sorted(inst.endpoints, key=lambda e: e.id):
                if not self.scheduler.is_broken(ep):
                    return Candidate(inst, ep)
            return None

        if g.union is not None:
            u = cand(g.union)
            return None if u is None else Route(g.engine, union=u)
        p, d = cand(g.prefill), cand(g.decode)
        return None if p is None or d is None else Route(g.engine, prefill=p, decode=d)

    async def probe(self, g: ProbeGroup, prompt: PrecisionPrompt) -> str | None:
        """One probe through the normal PD handoff of *g*; the answer text, None if none."""
        route = self._route(g)
        if route is None:
            return None
        chat = prompt.messages is not None
        body: dict[str, Any] = {"model": g.model, "max_tokens": self.cfg.max_tokens, "temperature": 0,
                                "seed": self.cfg.seed, "stream": False}
        if chat:
            body["messages"] = [dict(m) for m in prompt.messages or ()]
        else:
            body["prompt"] = prompt.prompt
        req = ParsedRequest(CHAT if chat else COMPLETIONS, body, g.model, False)
        d = self.dispatcher
        pinned = Dispatcher(PinnedScheduler(self.scheduler, route), d.client, d.adapters, d.cfg,
                            prefix_chars=d.prefix_chars)
        rid = f"precision-{uuid.uuid4().hex[:16]}"
        status, chunks, size = 0, [], 0
        try:
            async with asyncio.timeout(self.cfg.timeout_sec):
                # closed at once when left early: the engine's connection is dropped, not left to GC
                async with contextlib.aclosing(cast(AsyncGenerator[Frame, None], pinned.dispatch(req, rid))) as frames:
                    async for frame in frames:
                        if isinstance(frame, Head):
                            status = frame.http_status
                            continue
                        size += len(frame)
                        if size > MAX_ANSWER_BYTES:
                            log.info("precision probe answer passed %d bytes: taken as no answer", MAX_ANSWER_BYTES,
                                     extra={"instance_ids": list(g.ids), "request_id": rid})
                            return None
                        chunks.append(frame)
        except (MotorError, TimeoutError, aiohttp.ClientError, OSError) as exc:
            log.info("precision probe got no answer", extra={"instance_ids": list(g.ids), "request_id": rid,
                                                              "error": f"{type(exc).__name__}: {exc}"})
            return None
        if status != 200:
            log.info("precision probe answered HTTP %s", status, extra={"instance_ids": list(g.ids)})
            return None
        try:
            parsed = orjson.loads(b"".join(chunks))
        except orjson.JSONDecodeError:
            return None
        return extract_text(chat, parsed) if isinstance(parsed, dict) else None

    def _publish(self) -> None:
        alarmed = self.tracker.alarmed()
        self.scheduler.set_alarmed(alarmed)
        labels = {group_label(g) for g in self.tracker.groups()}
        for g in self.tracker.groups():
            ALARM_GAUGE.labels(group=group_label(g)).set(1 if g in alarmed else 0)
        for gone in self._labels - labels:
            ALARM_GAUGE.remove(gone)
        self._labels = labels


def _detail(samples: Sequence[Sample], answers: Sequence[str | None], expected: Sequence[str | None]) -> str:
    for i, s in enumerate(samples):
        if s is Sample.ABNORMAL:
            return f"prompt {i}: got {str(answers[i])[:80]!r}, expected {str(expected[i])[:80]!r}"
    return ""
