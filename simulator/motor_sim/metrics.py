"""Prometheus exposition with each engine's metric names, read from live state at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from motor_sim.config import Flavour
from motor_sim.service import SimService


class _SimCollector(Collector):
    def __init__(self, svc: SimService) -> None:
        self.svc = svc

    def _gauge(self, name: str, doc: str, value: float, labels: dict[str, str]) -> Metric:
        g = GaugeMetricFamily(name, doc, labels=list(labels))
        g.add_metric(list(labels.values()), value)
        return g

    def _counter(self, name: str, doc: str, value: float, labels: dict[str, str]) -> Metric:
        c = CounterMetricFamily(name, doc, labels=list(labels))
        c.add_metric(list(labels.values()), value)
        return c

    def collect(self) -> Iterator[Metric]:
        svc = self.svc
        eng, blocks, st = svc.engine, svc.blocks, svc.engine.stats
        model = svc.cfg.primary_name
        if svc.cfg.flavour is Flavour.VLLM:
            lb = {"model_name": model, "engine": "0"}
            yield self._gauge("vllm:num_requests_running", "Number of requests in model execution batches.", eng.num_running, lb)
            yield self._gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", eng.num_waiting, lb)
            yield self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", blocks.usage, lb)
            yield self._counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", blocks.prefix_queries, lb)
            yield self._counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", blocks.prefix_hits, lb)
            yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens, lb)
            yield self._counter("vllm:generation_tokens", "Number of generation tokens processed.", st.generation_tokens, lb)
            src = CounterMetricFamily("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                                      labels=["model_name", "engine", "source"])
            src.add_metric([model, "0", "local_compute"], st.prompt_tokens_local_compute)
            src.add_metric([model, "0", "local_cache_hit"], st.prompt_tokens_local_cache_hit)
            src.add_metric([model, "0", "external_kv_transfer"], st.prompt_tokens_external_kv_transfer)
            yield src
            c = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                    labels=["model_name", "engine", "finished_reason"])
            c.add_metric([model, "0", "length"], st.finished_length)
            c.add_metric([model, "0", "stop"], st.finished_stop)
            yield c
        else:
            lb = {"model_name": model}
            hit_rate = blocks.prefix_hits / blocks.prefix_queries if blocks.prefix_queries else 0.0
            yield self._gauge("sglang:num_running_reqs", "The number of running requests.", eng.num_running, lb)
            yield self._gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", eng.num_waiting, lb)
            yield self._gauge("sglang:token_usage", "The token usage.", blocks.usage, lb)
            yield self._gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", hit_rate, lb)
            yield self._counter("sglang:prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens, lb)
            yield self._counter("sglang:generation_tokens", "Number of generation tokens processed.", st.generation_tokens, lb)
            yield self._counter("sglang:num_requests", "Number of requests processed.", st.requests_finished, lb)
        lb = {"model_name": model}
        yield self._counter("motor_sim:kv_transfers", "KV transfers served to decode engines.", st.kv_transfers, lb)
        yield self._counter("motor_sim:kv_transfer_fallbacks", "Decode requests that recomputed the prefill because the KV transfer failed.", st.kv_transfer_fallbacks, lb)
        yield self._counter("motor_sim:kv_load_failures", "Decode requests failed because the KV load failed (kv_load_failure_policy fail).", st.kv_load_failures, lb)
        yield self._counter("motor_sim:kv_lease_expirations", "Pinned KV leases that expired unfetched.", st.kv_lease_expirations, lb)
        yield self._counter("motor_sim:requests_aborted", "Requests aborted before finishing (client disconnect).", st.requests_aborted, lb)
        yield self._gauge("motor_sim:kv_leases_pinned", "KV leases pinned for remote decode.", len(svc.leases), lb)
        yield self._gauge("motor_sim:kv_blocks_used", "KV blocks in use.", blocks.num_used, lb)
        yield self._counter("motor_sim:kv_evicted_blocks", "Prefix-cached KV blocks evicted to make room.", blocks.evicted_blocks, lb)


def make_registry(svc: SimService) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_SimCollector(svc))
    return reg


def render(reg: CollectorRegistry) -> bytes:
    return generate_latest(reg)
