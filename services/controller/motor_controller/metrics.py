"""The controller's Prometheus metrics, read from its state at scrape time (no bookkeeping on
the control path): instances by state, nodes and their heartbeat age, engine relaunches the
nodemanagers report, active alarms by kind, whether this controller acts, store records skipped
at the last load because they cannot be decoded, instances kept in routing with a node lost."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from motor_controller.alarms import AlarmKind
from motor_controller.model import InstanceState
from motor_controller.push_plan import kept_without_node

if TYPE_CHECKING:
    from motor_controller.controller import Controller


class ControllerCollector(Collector):
    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # families are built per scrape; no name reservation in the registry

    def collect(self) -> Iterator[GaugeMetricFamily]:
        c = self.controller
        acting = GaugeMetricFamily("motor_controller_acting",
                                   "1 while this controller acts (holds the lock, store reachable)")
        acting.add_metric([], 1.0 if c.acting else 0.0)
        yield acting

        by_state = Counter(mi.state.value for mi in c.instances.values())
        inst = GaugeMetricFamily("motor_controller_instances", "Managed instances by state", labels=["state"])
        for state in InstanceState:
            inst.add_metric([state.value], float(by_state.get(state.value, 0)))
        yield inst

        wall = c._wall()
        kept = GaugeMetricFamily("motor_controller_instances_routed_without_node",
                                 "INACTIVE instances a node of which is lost, kept in the coordinators' routing "
                                 "within node_lost_routing_grace_sec (the coordinators judge their engines)")
        kept.add_metric([], float(sum(kept_without_node(mi, c.signals.get(mi.id), wall) for mi in c.instances.values())))
        yield kept

        now = c._clock()  # the clock heartbeats are stamped with (stall-compensated)
        alive = Counter(c.is_alive(n) for n in c.nodes)
        nodes = GaugeMetricFamily("motor_controller_nodes", "Registered nodes, by whether their heartbeat is "
                                  "current (alive) or overdue", labels=["alive"])
        nodes.add_metric(["true"], float(alive.get(True, 0)))
        nodes.add_metric(["false"], float(alive.get(False, 0)))
        yield nodes

        age = GaugeMetricFamily("motor_controller_node_heartbeat_age_seconds",
                                "Seconds since each registered node's last heartbeat (absent before its first)",
                                labels=["node"])
        relaunch = GaugeMetricFamily("motor_controller_node_engine_relaunches",
                                     "Engine relaunches each node's nodemanager reports (since it started)",
                                     labels=["node"])
        for node_id in sorted(c.nodes):
            ob = c.observations.get(node_id)
            if ob is None:
                continue
            age.add_metric([node_id], max(0.0, now - ob.seen_at))
            relaunch.add_metric([node_id], float(ob.relaunch_count))
        yield age
        yield relaunch

        kinds = Counter(a.kind.value for a in c.alarms.active())
        alarms = GaugeMetricFamily("motor_controller_alarms_active", "Active (raised, not cleared) alarms by kind",
                                   labels=["kind"])
        for kind in AlarmKind:
            alarms.add_metric([kind.value], float(kinds.get(kind.value, 0)))
        yield alarms

        skipped = Counter(key.split("/", 1)[0] for key in c.unreadable)
        unreadable = GaugeMetricFamily("motor_controller_store_records_unreadable",
                                       "Store records skipped at the last load because they cannot be decoded "
                                       "(the log names each key)", labels=["prefix"])
        for prefix in ("nodes", "alarms"):
            unreadable.add_metric([prefix], float(skipped.get(prefix, 0)))
        yield unreadable


def register(controller: Controller) -> ControllerCollector:
    """Serve *controller*'s metrics from the default registry (``REGISTRY.unregister`` to stop)."""
    collector = ControllerCollector(controller)
    REGISTRY.register(collector)
    return collector
