"""The coordinator's state as Prometheus gauges, read at scrape time: registry generation and
size, whether the registry is authoritative, election role and isolation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from motor_common.leadership import LeaderRole

if TYPE_CHECKING:
    from motor_coordinator.app import Coordinator


class CoordinatorCollector(Collector):
    def __init__(self, app: Coordinator) -> None:
        self.app = app

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # built per scrape; no name reservation in the registry

    def collect(self) -> Iterator[GaugeMetricFamily]:
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
        inflight = GaugeMetricFamily("motor_coordinator_instance_requests_in_flight",
                                     "Requests being served by each registered instance's engines now (a PD "
                                     "request counts on its prefill and on its decode instance)",
                                     labels=["instance", "role", "model"])
        sched = self.app.scheduler
        for iid in sorted(state.instances):
            inst = state.instances[iid]
            n = sum(sched.inflight(ep) for ep in inst.endpoints)
            inflight.add_metric([str(iid), inst.role.value, inst.model_name], float(n))
        yield inflight
