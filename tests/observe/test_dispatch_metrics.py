"""Retries, failovers and scheduling decisions are counted as the dispatcher makes them.

Real ``motor-sim`` vLLM engines, an in-process coordinator (its Prometheus registry is this
process's) reached over its real gRPC Dispatch API: a decode nobody listens on (connection
refused) and a decode whose KV loads fail (the ``kv_load_fail`` fault).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from motor_common.domain import EngineType, Role
from tests.coordinator.test_decode_retry_sim import coordinator, dead_decode, outcome
from tests.coordinator.test_dispatch_sim import instance
from tests.procs import Proc, start_simulator

pytestmark = pytest.mark.slow

VLLM = EngineType.VLLM
MODEL = "sim-model"


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def counts() -> dict[str, float]:
    """The counters this test moves, by a short name."""
    out = {}
    for role in ("prefill", "decode"):
        for reason in ("unreachable", "kv_handoff_failed", "engine_error"):
            out[f"retries {role} {reason}"] = value("motor_coordinator_retries_total", model=MODEL, role=role, reason=reason)
            out[f"failovers {role} {reason}"] = value("motor_coordinator_failovers_total", model=MODEL, role=role,
                                                      reason=reason)
        for oc in ("routed", "retry_pick", "no_candidate"):
            out[f"decisions {role} {oc}"] = value("motor_coordinator_policy_decisions_total", policy="round_robin",
                                                  role=role, outcome=oc)
        for phase in ("prefill", "decode_first_byte", "kv_handoff"):
            out[f"phase {role} {phase}"] = value("motor_coordinator_pd_phase_duration_seconds_count",
                                                 model=MODEL, role=role, phase=phase)
    return out


def moved(before: dict[str, float]) -> dict[str, float]:
    return {k: v - before[k] for k, v in counts().items() if v != before[k]}


def set_fault(sim: Proc, **fault: object) -> None:
    req = urllib.request.Request(sim.url + "/sim/fault", data=json.dumps(fault).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200


async def test_unreachable_decode_counts_a_retry_a_failover_and_a_retry_pick(tmp_path: Path) -> None:
    async with AsyncExitStack() as st:
        p, d = await asyncio.gather(*(st.enter_async_context(start_simulator("vllm", r, tmp_path))
                                      for r in ("prefill", "decode")))
        _, s = await st.enter_async_context(coordinator())  # round robin, no probes
        await s.set(instance(1, Role.PREFILL, VLLM, [p]), instance(2, Role.DECODE, VLLM, [d]), dead_decode(3, VLLM))
        before = counts()
        results = [await outcome(s, i) for i in range(2)]  # round robin: one of the two hits the dead decode
        assert [r[0] for r in results] == ["http 200"] * 2, results
        assert moved(before) == {
            "retries decode unreachable": 1, "failovers decode unreachable": 1,
            "decisions prefill routed": 2, "decisions decode routed": 2, "decisions decode retry_pick": 1,
            "phase prefill prefill": 2, "phase decode decode_first_byte": 2, "phase decode kv_handoff": 2,
        }


async def test_failed_kv_handoff_counts_a_retry_by_its_reason_and_a_failover_only_to_another_decode(
    tmp_path: Path,
) -> None:
    async with AsyncExitStack() as st:
        p, d = await asyncio.gather(*(st.enter_async_context(start_simulator("vllm", r, tmp_path))
                                      for r in ("prefill", "decode")))
        _, s = await st.enter_async_context(coordinator())
        await s.set(instance(1, Role.PREFILL, VLLM, [p]), instance(2, Role.DECODE, VLLM, [d]))
        set_fault(d, mode="kv_load_fail", count=1)  # the next KV load fails, then it works
        before = counts()
        assert (await outcome(s, 0))[0] == "http 200"
        # the hand-off ran again on the same (only) decode: a retry, not a failover; the retry
        # found no other decode and no other prefill to pick; the prefill ran twice, the decode
        # answered once
        assert moved(before) == {
            "retries decode kv_handoff_failed": 1,
            "decisions prefill routed": 1, "decisions decode routed": 1, "decisions decode no_candidate": 1,
            "decisions prefill no_candidate": 1,
            "phase prefill prefill": 2, "phase decode decode_first_byte": 1, "phase decode kv_handoff": 1,
        }


async def test_probe_failure_series_of_an_endpoint_that_left_the_registry_are_removed() -> None:
    """Engines that come and go (a new pod IP or port each restart) must not grow /metrics: only
    registered endpoints keep a ``motor_coordinator_health_probe_failures_total`` series."""
    from motor_common.domain import Endpoint, Instance, InstanceStatus
    from tests.helpers import free_port, wait_for

    def failures(port: int) -> float | None:
        return REGISTRY.get_sample_value("motor_coordinator_health_probe_failures_total",
                                         {"endpoint": f"127.0.0.1:{port}"})

    ports = [free_port() for _ in range(5)]  # nothing listens on them: every probe fails
    async with coordinator(health_probe_interval_sec=0.05) as (_, s):
        for gen, port in enumerate(ports, start=1):
            ep = Endpoint(0, "127.0.0.1", port)
            await s.set(Instance(1, Role.UNION, "job-1", MODEL, VLLM, (ep,), InstanceStatus.AVAILABLE), generation=gen)
            await wait_for(lambda p=port: (failures(p) or 0) > 0, timeout=10, what=f"a probe failure of :{port}")
        await wait_for(lambda: all(failures(p) is None for p in ports[:-1]), timeout=10,
                       what="the series of the endpoints that left the registry removed")
        assert (failures(ports[-1]) or 0) > 0  # the registered endpoint keeps its count
