"""Port planning for this node's engines (the "ports" start-up step).

``base_port > 0``: business ports are ``base_port + i``, KV side-channel ports (vLLM)
``base_port + n + i``, bootstrap ports (SGLang prefill) ``base_port + 2n + i`` and, with KV-cache events
on, the engines' event publisher ports ``base_port + 3n + i`` and replay ports ``base_port + 4n + i``
(decode engines publish too: their cache is not routed on today, but what they hold is observable).
``base_port == 0``:
free ports are picked from the OS (tests). Endpoint ids and dp ranks are local (0..n-1); the
controller assigns global dp ranks in the start command.
"""

from __future__ import annotations

from collections.abc import Callable

from motor_common.domain import Endpoint, EngineType, Role


def plan_endpoints(
    *,
    ip: str,
    count: int,
    base_port: int,
    engine_type: EngineType,
    role: Role,
    node_id: str = "",
    pick: Callable[[], int] | None = None,
    avoid: set[int] | frozenset[int] = frozenset(),
    kv_events: bool = False,
    kv_events_replay: bool = True,
) -> tuple[Endpoint, ...]:
    """*avoid*: ports a pick must not return (this process's own, not yet bound). *kv_events*:
    plan a KV-event publisher port per engine (and a replay port with *kv_events_replay*)."""
    taken: set[int] = set(avoid)

    def fresh() -> int:
        assert pick is not None
        for _ in range(100):
            port = pick()
            if port not in taken:
                taken.add(port)
                return port
        raise RuntimeError("could not pick distinct free ports")

    def port(offset: int, i: int) -> int:
        return base_port + offset * count + i if base_port else fresh()

    out = []
    for i in range(count):
        business = port(0, i)
        kv = port(1, i) if engine_type is EngineType.VLLM and role is not Role.UNION else 0
        boot = port(2, i) if engine_type is EngineType.SGLANG and role is Role.PREFILL else 0
        events = port(3, i) if kv_events else 0
        replay = port(4, i) if kv_events and kv_events_replay else 0
        out.append(Endpoint(i, ip, business, bootstrap_port=boot, kv_port=kv, dp_rank=i, node_id=node_id,
                            kv_events_port=events, kv_events_replay_port=replay))
    return tuple(out)


def ports_of(endpoints: tuple[Endpoint, ...]) -> set[int]:
    """Every port the *endpoints* plan (business, KV side channel, bootstrap, KV events, replay)."""
    return {p for e in endpoints
            for p in (e.business_port, e.kv_port, e.bootstrap_port, e.kv_events_port, e.kv_events_replay_port) if p}
