"""A coordinator whose own event loop stalls (frozen by SIGSTOP, starved by CPU) does not wake up and
blame its engines: engine silence and breaker timers run on a stall-compensated clock
(motor_common.stall_clock), and a health probe that timed out across the stall is not counted.

The stall is made in process: the test blocks the event loop the coordinator runs on for longer than
``first_byte_timeout_sec`` while a request waits for a real ``motor-sim`` engine's first byte (the
engine answers during the stall). Measured on the raw clock, the watchdog would see an engine silent
for 2.5 s, refuse the request as a poison suspect and take the engine out of rotation."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import pytest

from motor_common.domain import EngineType, Role
from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_coordinator.monitor import parse_load
from tests.coordinator.test_decode_retry_sim import BODY
from tests.coordinator.test_dispatch_sim import COMPLETIONS, dispatch, instance, text_of
from tests.coordinator.test_first_byte_watchdog_sim import coordinator
from tests.helpers import wait_for
from tests.procs import start_simulator

pytestmark = pytest.mark.slow

STALL_SEC = 2.5  # > first_byte_timeout_sec (0.5) of the coordinator fixture


async def test_a_stall_of_the_coordinator_itself_neither_fails_the_request_nor_trips_the_engine(
        tmp_path: Path) -> None:
    async with AsyncExitStack() as st:
        u = await st.enter_async_context(
            start_simulator("vllm", "union", tmp_path, extra_args=["--sim-prefill-base-ms", "3000"]))
        s = await st.enter_async_context(coordinator(probe_interval=0.2))
        await s.set(instance(1, Role.UNION, EngineType.VLLM, [u]))
        await wait_for(_all_available(s), timeout=10, what="the engine available")
        sent = asyncio.ensure_future(dispatch(s, COMPLETIONS, BODY, timeout=30))
        await wait_for(lambda: _running(u.url), timeout=10, what="the request on the engine")
        time.sleep(STALL_SEC)  # blocking on purpose: the coordinator's loop stops, the engine answers after
        head, raw = await sent
        assert head.http_status == 200, raw[:300]
        assert len(text_of(COMPLETIONS, raw, False)[0].split()) == BODY["max_tokens"]
        listing = await s.list()
        assert [i.status for i in listing.instances] == [tpb.INSTANCE_STATUS_AVAILABLE]
        # and it keeps serving (nothing was taken out of rotation)
        head, _ = await dispatch(s, COMPLETIONS, BODY, timeout=30)
        assert head.http_status == 200


async def _running(url: str) -> bool:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=2)) as r:
        text = await r.text()
    load = parse_load(text, EngineType.VLLM)
    return load.running + load.waiting > 0


def _all_available(s):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        listing = await s.list()
        return bool(listing.instances) and all(
            i.status == tpb.INSTANCE_STATUS_AVAILABLE for i in listing.instances)
    return check
