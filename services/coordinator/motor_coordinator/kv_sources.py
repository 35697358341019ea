"""Which KV-event streams the coordinator follows, derived from the registry (pure).

Every prefill or union endpoint that announces a ``kv_events_port`` is one source, keyed like the
scheduler's candidates (``instance id/host:port``), so an instance that is replaced (new id or new
ports) is a new source and starts from an empty index. Decode engines are not followed: the
policy routes prefill by what is cached; decode goes by load. The subscription takes every topic
(the topic is the nodemanager's setting, not announced).
"""

from __future__ import annotations

from collections.abc import Iterable

from motor_common.domain import EngineType, Instance, Role
from motor_common.kv_events import Flavour
from motor_common.ports import host_port
from motor_coordinator.kv_subscriber import EventSource
from motor_coordinator.policies.base import candidate_key

_FOLLOWED = (Role.PREFILL, Role.UNION)


def event_sources(instances: Iterable[Instance]) -> list[EventSource]:
    out = []
    for inst in instances:
        if inst.role not in _FOLLOWED:
            continue
        flavour = Flavour.SGLANG if inst.engine_type is EngineType.SGLANG else Flavour.VLLM
        for ep in inst.endpoints:
            if not ep.kv_events_port:
                continue
            replay = f"tcp://{host_port(ep.ip, ep.kv_events_replay_port)}" if ep.kv_events_replay_port else None
            out.append(EventSource(
                engine=candidate_key(inst, ep),
                model=inst.model_name,
                flavour=flavour,
                endpoint=f"tcp://{host_port(ep.ip, ep.kv_events_port)}",
                replay_endpoint=replay,
            ))
    return out
