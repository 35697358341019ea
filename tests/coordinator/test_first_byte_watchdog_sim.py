"""The first-byte watchdog tells a slow request from a hung engine: a real ``motor-sim`` union
engine that takes 1.5 s to its first byte, under a 0.5 s ``first_byte_timeout_sec``, is waited for
as long as it answers its health probes, and the watchdog is off when probes are off."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest

from motor_common.domain import EngineType, Role
from motor_common.grpc_server import ServerConfig
from motor_coordinator.app import Coordinator
from motor_coordinator.config import CoordinatorConfig, DispatchConfig
from tests.coordinator.grpc_util import KEY, Stubs
from tests.coordinator.test_decode_retry_sim import BODY
from tests.coordinator.test_dispatch_sim import COMPLETIONS, dispatch, instance, text_of
from tests.procs import start_simulator

pytestmark = pytest.mark.slow


@asynccontextmanager
async def coordinator(probe_interval: float) -> AsyncIterator[Stubs]:
    cfg = CoordinatorConfig(server=ServerConfig(port=0), dispatch=DispatchConfig(
        first_byte_timeout_sec=0.5, health_probe_interval_sec=probe_interval, probe_timeout_sec=0.3,
        metrics_scrape_interval_sec=0))
    app = Coordinator(cfg, management_key=KEY)
    port = await app.start()
    stubs = Stubs(f"127.0.0.1:{port}")
    try:
        yield stubs
    finally:
        await stubs.close()
        await app.stop(0)


@pytest.mark.parametrize("probe_interval", [0.2, 0.0], ids=["probes-on", "probes-off"])
async def test_a_slow_first_byte_from_a_live_engine_is_waited_for(probe_interval: float, tmp_path: Path) -> None:
    async with AsyncExitStack() as st:
        u = await st.enter_async_context(
            start_simulator("vllm", "union", tmp_path, extra_args=["--sim-prefill-base-ms", "1500"]))
        s = await st.enter_async_context(coordinator(probe_interval))
        await s.set(instance(1, Role.UNION, EngineType.VLLM, [u]))
        head, raw = await dispatch(s, COMPLETIONS, BODY, timeout=20)
        assert head.http_status == 200
        assert len(text_of(COMPLETIONS, raw, False)[0].split()) == BODY["max_tokens"]
