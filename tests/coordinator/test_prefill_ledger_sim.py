"""The kv_events policy's prefill-token ledger through the real dispatcher: while a prefill runs on
a real ``motor-sim`` engine, the tokens the policy expects it to compute are queued on that
endpoint (what the next decision weighs), and they leave when the request ends — also when the
client cancels it mid-prefill. In-process coordinator (to read the scheduler), real gRPC API."""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from motor_common.domain import EngineType, Role
from motor_common.grpc_server import ServerConfig
from motor_coordinator.app import Coordinator
from motor_coordinator.config import (
    CoordinatorConfig,
    DispatchConfig,
    KvEventsConfig,
    SchedulerConfig,
)
from motor_coordinator.request import COMPLETIONS as PARSED_COMPLETIONS
from motor_coordinator.request import parsed_request
from tests.coordinator.grpc_util import KEY, Stubs
from tests.coordinator.test_dispatch_sim import COMPLETIONS, MODEL, dispatch, instance
from tests.helpers import wait_for
from tests.procs import start_simulator

pytestmark = pytest.mark.slow

BODY = {"model": MODEL, "prompt": "the ledger counts what the prefill computes " * 8, "max_tokens": 2}


async def test_a_running_prefill_queues_its_tokens_on_its_endpoint_until_it_ends(tmp_path: Path) -> None:
    cfg = CoordinatorConfig(
        server=ServerConfig(port=0),
        scheduler=SchedulerConfig(policy="kv_events", kv_events=KvEventsConfig(tokenizer="simulator")),
        dispatch=DispatchConfig(health_probe_interval_sec=0, metrics_scrape_interval_sec=0),
    )
    async with AsyncExitStack() as st:
        # the prefill takes an hour: the request is in its prefill for as long as the test needs
        p = await st.enter_async_context(start_simulator(
            "vllm", "prefill", tmp_path, extra_args=["--sim-prefill-base-ms", "3600000"]))
        d = await st.enter_async_context(start_simulator("vllm", "decode", tmp_path))
        app = Coordinator(cfg, management_key=KEY)
        port = await app.start()
        st.push_async_callback(app.stop, 0)
        s = Stubs(f"127.0.0.1:{port}")
        st.push_async_callback(s.close)
        prefill = instance(1, Role.PREFILL, EngineType.VLLM, [p])
        await s.set(prefill, instance(2, Role.DECODE, EngineType.VLLM, [d]))
        ep = prefill.endpoints[0]
        assert app.dispatcher.token_ids is not None
        ids = app.dispatcher.token_ids(parsed_request(PARSED_COMPLETIONS, BODY))
        assert ids is not None and len(ids) > 16  # more than one block: the policy decides, not skipped

        call = asyncio.create_task(dispatch(s, COMPLETIONS, BODY, timeout=60))
        # no KV events from this engine: nothing is cached anywhere, the whole prompt is queued
        await wait_for(lambda: app.scheduler.queued_tokens(ep) == len(ids), timeout=20,
                       what="the prompt's tokens queued on the prefill while it runs")
        assert app.scheduler.inflight(ep) == 1
        call.cancel()  # the client goes away mid-prefill
        with contextlib.suppress(asyncio.CancelledError):
            await call
        await wait_for(lambda: app.scheduler.queued_tokens(ep) == 0 and app.scheduler.inflight(ep) == 0,
                       timeout=20, what="the ledger empty again after the cancelled request")
