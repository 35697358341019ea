"""The coordinator's state as Prometheus gauges, read at scrape time: registry generation and
size, whether the registry is authoritative, election role and isolation, the models served by one
side of their pair alone, and (policy kv_events)
what the KV-event index holds per engine and how the policy decided."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from motor_common.leadership import LeaderRole
from motor_coordinator.policies.kv_events import KvEvents

if TYPE_CHECKING:
    from motor_coordinator.kv_index import KvIndex
    from motor_coordinator.kv_subscriber import KvEventSubscriber
    from motor_coordinator.leadership import Leadership
    from motor_coordinator.policies import Policy
    from motor_coordinator.registry import RegistryState
    from motor_coordinator.scheduler import Scheduler


class Observed(Protocol):
    """What the collector reads: a coordinator, or one of its front workers (its mirror)."""

    @property
    def state(self) -> RegistryState: ...

    @property
    def leadership(self) -> Leadership: ...

    @property
    def scheduler(self) -> Scheduler: ...

    @property
    def kv_events(self) -> KvEventSubscriber | None: ...

    @property
    def kv_index(self) -> KvIndex: ...

    @property
    def policy(self) -> Policy: ...


class CoordinatorCollector(Collector):
    def __init__(self, app: Observed) -> None:
        self.app = app

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # built per scrape; no name reservation in the registry

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        state, lead = self.app.state, self.app.leadership
        gen = GaugeMetricFamily("motor_coordinator_registry_generation",
                                "Generation of the instance registry (the controller's last applied write)")
        gen.add_metric([], float(state.generation))
        yield gen
        size = GaugeMetricFamily("motor_coordinator_registry_instances", "Instances in the registry")
        size.add_metric([], float(len(state.instances)))
        yield size
        auth = GaugeMetricFamily("motor_coordinator_registry_authoritative",
                                 "1 once the registry was set by a SET or ADD (before: requests get 503 "
                                 "REGISTRY_NOT_SYNCED)")
        auth.add_metric([], 1.0 if state.authoritative else 0.0)
        yield auth
        role = GaugeMetricFamily("motor_coordinator_election_role",
                                 "1 for this coordinator's election role (standalone, master, standby)",
                                 labels=["role"])
        for r in LeaderRole:
            role.add_metric([r.value], 1.0 if lead.role is r else 0.0)
        yield role
        iso = GaugeMetricFamily("motor_coordinator_isolated",
                                "1 while this coordinator is isolated (master that lost its election store)")
        iso.add_metric([], 1.0 if lead.isolated else 0.0)
        yield iso
        alone = GaugeMetricFamily("motor_coordinator_model_served_alone",
                                  "1 for a model one side of its prefill/decode pair serves alone now (role "
                                  "decode: no prefill schedulable, its decodes compute whole requests; role "
                                  "prefill: no decode schedulable, its prefills decode too): degraded, slower",
                                  labels=["model", "role"])
        for model, side in sorted(self.app.scheduler.served_alone().items()):
            alone.add_metric([model, side.value], 1.0)
        yield alone
        inflight = GaugeMetricFamily("motor_coordinator_instance_requests_in_flight",
                                     "Requests being served by each registered instance's engines now (a PD "
                                     "request counts on its prefill and on its decode instance)",
                                     labels=["instance", "role", "model"])
        sched = self.app.scheduler
        sched.refresh(force=True)  # the other front workers' load, as of now (http.workers > 1)
        for iid in sorted(state.instances):
            inst = state.instances[iid]
            n = sum(sched.inflight(ep) for ep in inst.endpoints)
            inflight.add_metric([str(iid), inst.role.value, inst.model_name], float(n))
        yield inflight
        yield from self._kv_events()

    def _kv_events(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        if self.app.kv_events is None:
            return
        index = self.app.kv_index
        blocks = GaugeMetricFamily("motor_coordinator_kv_index_blocks",
                                   "KV blocks the engine holds per its KV events (policy kv_events)",
                                   labels=["engine", "model"])
        stale = GaugeMetricFamily("motor_coordinator_kv_index_stale",
                                  "1 while the engine's KV-event stream is not trusted (disconnected, gap, "
                                  "nothing received yet): it counts as holding nothing",
                                  labels=["engine", "model"])
        for engine in sorted(index.engines()):
            model = index.model_of(engine)
            blocks.add_metric([engine, model], float(index.block_count(engine)))
            stale.add_metric([engine, model], 1.0 if index.is_stale(engine) else 0.0)
        yield blocks
        yield stale
        policy = self.app.policy
        if isinstance(policy, KvEvents):
            routed = CounterMetricFamily("motor_coordinator_kv_events_decisions",
                                         "Prefill choices of the kv_events policy: by held prefix, by the ring "
                                         "for a cold prefix, by the ring without usable events or token ids",
                                         labels=["decision"])
            for name, n in (("prefix", policy.routed), ("cold", policy.cold), ("fallback", policy.fallbacks)):
                routed.add_metric([name], float(n))
            yield routed
