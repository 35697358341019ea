"""What serves requests, built from a coordinator's config: the scheduler and its policy, the KV
event index and its subscriber, the engine client, the dispatcher and the engine monitor.

A coordinator runs one; each of its co-located front workers (``http.workers`` > 1,
``front_worker``) runs its own, fed with the coordinator's instance set.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from motor_common.stall_clock import StallCompensatedClock, lag_monitor
from motor_common.tasks import TaskOwner
from motor_coordinator.adapters import default_adapters
from motor_coordinator.config import CoordinatorConfig
from motor_coordinator.dispatcher import Dispatcher
from motor_coordinator.engine_client import EngineClient
from motor_coordinator.hf_tokenizer_loader import load_hf_tokenizers
from motor_coordinator.kv_index import KvIndex
from motor_coordinator.kv_sources import event_sources
from motor_coordinator.kv_subscriber import KvEventSubscriber
from motor_coordinator.monitor import Monitor
from motor_coordinator.policies import NEEDS_KV_EVENTS, PolicyContext, make_policy
from motor_coordinator.precision_routing import PrecisionAwareScheduler
from motor_coordinator.prompt_tokens import PromptTokens
from motor_coordinator.registry import RegistryState
from motor_coordinator.request import ParsedRequest
from motor_coordinator.tokenize_offload import TokenizeOffload


class DataPlane:
    def __init__(self, cfg: CoordinatorConfig) -> None:
        d = cfg.dispatch
        kv = cfg.scheduler.kv_events
        self.kv_index = KvIndex(kv.max_blocks_per_engine, silence_timeout=kv.silence_timeout_sec)
        # Only a policy that routes by KV events subscribes to the engines' event streams.
        self.kv_events: KvEventSubscriber | None = None
        token_ids: Callable[[ParsedRequest], tuple[int, ...] | None] | None = None
        # tokenizer hf: long prompts are encoded in a worker thread (tokenize_offload.py)
        self.tokenize_offload: TokenizeOffload | None = None
        if cfg.scheduler.policy in NEEDS_KV_EVENTS:
            self.kv_events = KvEventSubscriber(self.kv_index, replay_timeout_s=kv.replay_timeout_sec)
            hf, hf_models = (load_hf_tokenizers(kv.tokenizer_path, kv.tokenizer_paths)  # ConfigError: exit 2
                             if kv.tokenizer == "hf" else (None, {}))
            token_ids = PromptTokens(kv.tokenizer, kv.max_prompt_tokens, hf=hf, hf_models=hf_models)
            if kv.tokenizer == "hf":
                self.tokenize_offload = TokenizeOffload()
        self.policy = make_policy(cfg.scheduler, PolicyContext(self.kv_index))
        # Engine silence and breaker cool-downs are measured on a clock that stops while this
        # process is frozen or starved (stall_clock.py): waking up, it does not blame the engines.
        self.stall_clock = StallCompensatedClock()
        self.scheduler = PrecisionAwareScheduler(
            self.policy,
            breaker_failures=d.circuit_breaker_failures,
            breaker_cooldown=d.circuit_breaker_cooldown_sec,
            clock=self.stall_clock,
            decode_only_fallback=cfg.scheduler.decode_only_fallback,
            prefill_only_fallback=cfg.scheduler.prefill_only_fallback,
        )
        self.client = EngineClient(connect_timeout=d.connect_timeout_sec, probe_timeout=d.probe_timeout_sec,
                                   keepalive=d.engine_keepalive_sec, clock=self.stall_clock)
        self.dispatcher = Dispatcher(
            self.scheduler, self.client, default_adapters(), d, prefix_chars=cfg.scheduler.prefix_chars,
            token_ids=token_ids, tokenize_offload=self.tokenize_offload,
        )
        self.monitor = Monitor(
            self.scheduler, self.client,
            probe_interval=d.health_probe_interval_sec, scrape_interval=d.metrics_scrape_interval_sec,
        )
        self._probe_interval = d.health_probe_interval_sec
        self._scrape_interval = d.metrics_scrape_interval_sec

    def accept(self, state: RegistryState) -> None:
        """A new instance set: the scheduler's, and the KV event streams to follow."""
        self.scheduler.accept(state)
        if self.kv_events is not None:
            self.kv_events.set_sources(event_sources(state.instances.values()))

    def watch_loop(self, tasks: TaskOwner, log: logging.Logger) -> None:
        """Feed the stall-compensated clock (this process's event loop stalls)."""
        tasks.spawn(lag_monitor(self.stall_clock, log, "engine silence"), name="lag-monitor")

    def watch_engines(self, tasks: TaskOwner) -> None:
        """The health probes and metrics scrapes of the engines."""
        if self._probe_interval > 0:
            tasks.spawn(self.monitor.probe_loop(), name="health-probe")
            self.dispatcher.probe_now = lambda ep: self.monitor.probe_now(
                ep, lambda coro: tasks.spawn(coro, name="health-probe-now"))
        if self._scrape_interval > 0:
            tasks.spawn(self.monitor.scrape_loop(), name="metrics-scrape")

    async def close(self) -> None:
        """After the caller's tasks were cancelled."""
        if self.kv_events is not None:
            await self.kv_events.close()
        if self.tokenize_offload is not None:
            self.tokenize_offload.close()
        await self.client.close()
