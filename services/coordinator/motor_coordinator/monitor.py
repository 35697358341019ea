"""Background health probes and metrics scrapes of every registered engine endpoint, and the
engines' own model cards (``motor_common.model_card``), read by the scrape loop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from motor_common.domain import Endpoint, EngineType
from motor_common.model_card import MAX_BODY_BYTES, ModelCard, parse_card
from motor_coordinator import metrics
from motor_coordinator.engine_client import STALL_TOLERANCE, EngineClient
from motor_coordinator.policies import EngineLoad
from motor_coordinator.scheduler import EndpointKey, ProbeTarget, Scheduler, endpoint_key

log = logging.getLogger(__name__)


_GAUGES = {
    EngineType.VLLM: ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"),
    EngineType.SGLANG: ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"),
}


def _sample(line: str) -> tuple[str, float] | None:
    """``name{labels} value [ts]`` → (name, value); None for comments and junk."""
    if not line or line.startswith("#"):
        return None
    brace, space = line.find("{"), line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        name, rest = line[:brace], line[line.rfind("}") + 1 :]
    elif space != -1:
        name, rest = line[:space], line[space:]
    else:
        return None
    parts = rest.split()
    try:
        return name, float(parts[0])
    except (ValueError, IndexError):
        return None


def parse_load(text: str, engine: EngineType) -> EngineLoad:
    """Sum the engine's running/waiting gauges and take the max KV usage over label sets (pure)."""
    running_name, waiting_name, kv_name = _GAUGES[engine]
    running = waiting = kv = 0.0
    for line in text.splitlines():
        sample = _sample(line)
        if sample is None:
            continue
        name, value = sample
        if name == running_name:
            running += value
        elif name == waiting_name:
            waiting += value
        elif name == kv_name:
            kv = max(kv, value)
    return EngineLoad(running=running, waiting=waiting, kv_usage=kv)


class Monitor:
    def __init__(self, scheduler: Scheduler, client: EngineClient, *, probe_interval: float, scrape_interval: float) -> None:
        self.scheduler = scheduler
        self.client = client
        self.probe_interval = probe_interval
        self.scrape_interval = scrape_interval
        self._probing: set[EndpointKey] = set()  # on-demand probes under way
        # The engines' own card of each registered model (GET /v1/models of one of its engines),
        # learned by the scrape loop; dropped when the model is no longer registered.
        self.cards: dict[str, ModelCard] = {}
        # Endpoints with a probe-failure series: a series is removed once its endpoint leaves the
        # registry, so engines that come and go (a new pod IP each restart) do not grow /metrics.
        self._failure_series: set[str] = set()

    def probe_now(self, endpoint: Endpoint, spawn: Callable[[Coroutine[Any, Any, None]], object]) -> None:
        """Probe *endpoint* at once (an attempt on it is waiting while it is silent), unless a
        probe of it is already under way: a hung engine is then proven hung within milliseconds of
        going silent, so fewer requests count as poison suspects (liveness.py)."""
        key = endpoint_key(endpoint)
        if key in self._probing:
            return
        self._probing.add(key)
        spawn(self._probe_one(key, endpoint))

    async def _probe_one(self, key: EndpointKey, endpoint: Endpoint) -> None:
        try:
            await self._probe_and_record(key, endpoint)
        finally:
            self._probing.discard(key)

    async def _probe(self, t: ProbeTarget) -> None:
        await self._probe_and_record(t.key, t.endpoint)

    async def _probe_and_record(self, key: EndpointKey, endpoint: Endpoint) -> None:
        sent_at, raw_sent = self.scheduler.clock(), time.monotonic()
        ok = await self.client.probe(endpoint)
        if not ok:
            stalled = (time.monotonic() - raw_sent) - (self.scheduler.clock() - sent_at)
            if stalled > STALL_TOLERANCE:
                # This process froze or starved while the probe waited: its timeout says nothing
                # about the engine (a stall-compensated scheduler clock shows the gap).
                log.info("health probe of %s timed out across a %.1fs stall of this process: not counted",
                         endpoint.host_port, stalled)
                return
            if self.scheduler.liveness.alive_since(key, sent_at):
                # It answered requests while the probe waited: slow (a starved API server), not
                # dead. Hung engines are caught by the first-byte watchdog (liveness.py).
                log.info("health probe of %s failed while the engine was answering requests: not counted",
                         endpoint.host_port)
                return
            metrics.PROBE_FAILURES.labels(endpoint.host_port).inc()
            self._failure_series.add(endpoint.host_port)
        self.scheduler.record_probe(key, ok, sent_at)

    async def _scrape(self, t: ProbeTarget) -> None:
        text = await self.client.get_text(t.endpoint, "/metrics")
        if text is not None:
            self.scheduler.set_load(t.key, parse_load(text, t.engine))

    async def probe_loop(self) -> None:
        while True:
            targets = self.scheduler.probe_targets()
            if targets:
                await asyncio.gather(*(self._probe(t) for t in targets))
            self._drop_failure_series({t.endpoint.host_port for t in self.scheduler.probe_targets()})
            await asyncio.sleep(self.probe_interval)

    def _drop_failure_series(self, registered: set[str]) -> None:
        for gone in self._failure_series - registered:
            metrics.PROBE_FAILURES.remove(gone)
        self._failure_series &= registered

    async def learn_cards(self) -> None:
        """Read the card of every registered model that has none yet from one of its engines
        (each instance's first endpoint in turn until one answers); forget unregistered models."""
        models = self.scheduler.models()
        for gone in [m for m in self.cards if m not in models]:
            del self.cards[gone]

        async def learn(model: str, endpoints: list[Endpoint]) -> None:
            for ep in endpoints:
                body = await self.client.get_bounded(ep, "/v1/models", MAX_BODY_BYTES)
                card = parse_card(body, model) if body is not None else None
                if card is not None:
                    self.cards[model] = card
                    return

        missing = [(m, [i.endpoints[0] for i in insts if i.endpoints])
                   for m, insts in models.items() if m not in self.cards]
        if missing:
            await asyncio.gather(*(learn(m, eps) for m, eps in missing))

    async def scrape_loop(self) -> None:
        while True:
            targets = self.scheduler.probe_targets()
            if targets:
                await asyncio.gather(*(self._scrape(t) for t in targets), self.learn_cards())
            await asyncio.sleep(self.scrape_interval)
