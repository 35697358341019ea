"""An unreachable decode endpoint (nothing listens on its port) is retried on another decode.

Real ``motor-sim`` engines and a dead port, dispatched through the real gRPC API of an in-process
coordinator (so the scheduler's in-flight counters can be read afterwards). Health probes are off:
only request outcomes move the breakers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from motor_common.domain import Endpoint, EngineType, Instance, InstanceStatus, Role
from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.grpc_server import ServerConfig, error_reason
from motor_coordinator.app import Coordinator
from motor_coordinator.config import CoordinatorConfig, DispatchConfig, SchedulerConfig
from tests.coordinator.grpc_util import KEY, Stubs
from tests.coordinator.test_dispatch_sim import (
    COMPLETIONS,
    MODEL,
    dispatch,
    instance,
    sim_state,
    text_of,
)
from tests.helpers import free_port, wait_for
from tests.procs import Proc, start_simulator

pytestmark = pytest.mark.slow

ENGINES = {"vllm": EngineType.VLLM, "sglang": EngineType.SGLANG}
BODY = {"model": MODEL, "prompt": "The quick brown fox jumps", "max_tokens": 6}


def dead_decode(iid: int, engine: EngineType) -> Instance:
    """A decode instance on a port nobody listens on (connection refused)."""
    ep = Endpoint(0, "127.0.0.1", free_port())
    return Instance(iid, Role.DECODE, f"job-{iid}", MODEL, engine, (ep,), InstanceStatus.AVAILABLE)


@asynccontextmanager
async def coordinator(prefill_only_fallback: bool = True, **dispatch_cfg: Any) -> AsyncIterator[tuple[Coordinator, Stubs]]:
    cfg = CoordinatorConfig(
        server=ServerConfig(port=0),
        # round robin: every other request goes to the dead decode
        scheduler=SchedulerConfig(policy="round_robin", prefill_only_fallback=prefill_only_fallback),
        dispatch=DispatchConfig(**{"health_probe_interval_sec": 0, "metrics_scrape_interval_sec": 0,
                                   "connect_timeout_sec": 1.0, **dispatch_cfg}),
    )
    app = Coordinator(cfg, management_key=KEY)
    port = await app.start()
    stubs = Stubs(f"127.0.0.1:{port}")
    try:
        yield app, stubs
    finally:
        await stubs.close()
        await app.stop(0)


async def pair(engine: str, tmp: Path, st: AsyncExitStack) -> tuple[Proc, Proc]:
    p, d = await asyncio.gather(*(st.enter_async_context(start_simulator(engine, r, tmp)) for r in ("prefill", "decode")))
    return p, d


async def outcome(s: Stubs, i: int) -> tuple[str, str]:
    """("http 200", text) or (gRPC code, "reason: details")."""
    try:
        head, raw = await dispatch(s, COMPLETIONS, {**BODY, "prompt": f"{BODY['prompt']} {i}"}, timeout=20)
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, f"{error_reason(exc)}: {exc.details()}"
    return f"http {head.http_status}", f"decode={head.decode_instance_id} text={text_of(COMPLETIONS, raw, False)[0]}"


async def nothing_in_flight(app: Coordinator, *instances: Instance) -> None:
    """Every attempt's load_guard was released (a leaked count would skew least_load forever)."""
    eps = [ep for inst in instances for ep in inst.endpoints]
    await wait_for(lambda: all(app.scheduler.inflight(ep) == 0 for ep in eps), timeout=5,
                   what="in-flight counts back to 0")


async def engines_idle(*sims: Proc) -> None:
    await wait_for(lambda: asyncio.to_thread(lambda: all(sim_state(s)["running"] == 0 for s in sims)),
                   timeout=10, what="engines idle (no prefill left waiting for a decode)")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_unreachable_decode_is_retried_on_another_decode_and_every_request_succeeds(
    engine: str, tmp_path: Path
) -> None:
    etype = ENGINES[engine]
    async with AsyncExitStack() as st:
        p, d = await pair(engine, tmp_path, st)
        app, s = await st.enter_async_context(coordinator())
        live_p, live_d = instance(1, Role.PREFILL, etype, [p]), instance(2, Role.DECODE, etype, [d])
        dead = dead_decode(3, etype)
        await s.set(live_p, live_d, dead)
        results = [await outcome(s, i) for i in range(10)]
        assert [r[0] for r in results] == ["http 200"] * 10, results
        assert all(r[1].startswith("decode=2 text=") and len(r[1]) > len("decode=2 text=") for r in results)
        # the dead decode was really chosen (round robin) and failed: its breaker opened after 3
        # connect errors, so it is listed UNAVAILABLE; the live decode answered all 10
        listed = {i.id: i.status for i in (await s.list()).instances}
        assert listed == {1: tpb.INSTANCE_STATUS_AVAILABLE, 2: tpb.INSTANCE_STATUS_AVAILABLE,
                          3: tpb.INSTANCE_STATUS_UNAVAILABLE}
        assert (await asyncio.to_thread(sim_state, d))["stats"]["requests_finished"] == 10
        await nothing_in_flight(app, live_p, live_d, dead)
        await engines_idle(p, d)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_decode_retries_0_fails_requests_that_meet_the_unreachable_decode_with_decode_failed(
    engine: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    etype = ENGINES[engine]
    async with AsyncExitStack() as st:
        p, d = await pair(engine, tmp_path, st)
        # (with scheduler.prefill_only_fallback a vLLM prefill would answer them whole:
        # tests/coordinator/test_dispatch_sim.py)
        app, s = await st.enter_async_context(coordinator(prefill_only_fallback=False, decode_retries=0))
        live_p, live_d = instance(1, Role.PREFILL, etype, [p]), instance(2, Role.DECODE, etype, [d])
        dead = dead_decode(3, etype)
        await s.set(live_p, live_d, dead)
        results = [await outcome(s, i) for i in range(4)]  # round robin: 2 on each decode
        ok = [r for r in results if r[0] == "http 200"]
        failed = [r for r in results if r[0] != "http 200"]
        assert len(ok) == 2 and len(failed) == 2, results
        for code, detail in failed:
            assert code == "UNAVAILABLE" and detail.startswith("DECODE_FAILED: decode failed on 1 decode endpoint(s)")
            # The engine's address stays in the coordinator's log, under the request id the error names.
            dead_addr = f"127.0.0.1:{dead.endpoints[0].business_port}"
            assert dead_addr not in detail and "request id" in detail, detail
            rid = detail.rsplit(" ", 1)[-1].rstrip(")")
            assert any(rid in r.getMessage() and f"{dead_addr} unreachable" in r.getMessage() for r in caplog.records)
        await nothing_in_flight(app, live_p, live_d, dead)
        await engines_idle(p, d)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_request_fails_with_decode_failed_when_every_decode_is_unreachable(
    engine: str, tmp_path: Path
) -> None:
    etype = ENGINES[engine]
    async with AsyncExitStack() as st:
        p = await st.enter_async_context(start_simulator(engine, "prefill", tmp_path))
        # decode_retries=2 by default; the fallback would have the vLLM prefill answer whole
        app, s = await st.enter_async_context(coordinator(prefill_only_fallback=False))
        live_p, dead1, dead2 = instance(1, Role.PREFILL, etype, [p]), dead_decode(2, etype), dead_decode(3, etype)
        await s.set(live_p, dead1, dead2)
        code, detail = await outcome(s, 0)
        assert code == "UNAVAILABLE", detail
        assert detail.startswith("DECODE_FAILED: decode failed on 2 decode endpoint(s) for model 'sim-model'"), detail
        await nothing_in_flight(app, live_p, dead1, dead2)
        await engines_idle(p)
