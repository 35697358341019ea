"""Clients that leave or stop reading must not keep requests running, against real processes: a
real ``motor-gateway`` (DispatchMany on, the default; one request of the model in flight, none
queued, so a held admission slot shows as 429), a real ``motor-coordinator`` and two simulated vLLM
engines (zero-latency decode: a large streamed answer comes at once; a prefill that can be slowed).

* A client that disconnects before the response head gets its request cancelled on the stream:
  the coordinator and the engine stop it, not at its deadline.
* A client that stops reading a streamed answer (socket buffers full) is cut off at the request's
  deadline: its admission slot is free again and the engine's request is over. The same for the
  co-located front (in process, over a scripted dispatcher), whose engine stream stays open else.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.openai_front.admission import AdmissionConfig
from motor_common.openai_front.app import STALL_GRACE_SEC
from tests.e2e.test_standalone import register_engines
from tests.gateway.fakes import chunk, head, in_process_gateway, replay
from tests.gateway.test_flow_control import SlowClient
from tests.helpers import http_ok, wait_for
from tests.procs import Proc, start_coordinator, start_gateway, start_simulator

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180)]

MODEL = "tiny"
KEY = "client-gone-management-key"
REQUEST_TIMEOUT = 8.0
# ~18 MB of SSE: far more than the socket buffers and the DispatchMany window hold.
BIG = {"model": MODEL, "prompt": "a long answer", "max_tokens": 20000, "n": 2, "logprobs": 5,
       "temperature": 0, "stream": True}
SMALL = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
ONE_AT_A_TIME = {"max_in_flight_per_model": 1, "max_queued_per_model": 0}


@dataclass
class Fleet:
    coordinator: Proc
    gateway: Proc
    prefill: Proc
    decode: Proc


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Fleet]:
    logs = tmp_path_factory.mktemp("client-gone")
    async with AsyncExitStack() as es:
        prefill = await es.enter_async_context(start_simulator(
            "vllm", "prefill", logs, model=MODEL, extra_args=("--max-model-len", "100000")))
        decode = await es.enter_async_context(start_simulator(
            "vllm", "decode", logs, model=MODEL, extra_args=("--sim-zero-latency", "--max-model-len", "100000")))
        coordinator = await es.enter_async_context(start_coordinator(
            logs, {"server": {"metrics_port": 0}}, management_key=KEY))
        (logs / "cli.key").write_text(KEY)
        await register_engines(coordinator.address, logs / "cli.key", MODEL, "vllm",
                               (("prefill", prefill), ("decode", decode)))
        gateway = await es.enter_async_context(start_gateway(logs, [coordinator.address], config={
            "request_timeout_sec": REQUEST_TIMEOUT, "admission": ONE_AT_A_TIME}))
        await wait_for(lambda: http_ok(gateway.url), timeout=30, what="gateway ready")
        yield Fleet(coordinator, gateway, prefill, decode)


async def _gauge(url: str, name: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith((name + " ", name + "{")))


async def _coordinator_in_flight(fleet: Fleet) -> float:
    return await _gauge(f"http://127.0.0.1:{fleet.coordinator.ports['metrics']}",
                        "motor_coordinator_requests_in_flight")


async def _engine_requests(engine: Proc) -> float:
    return (await _gauge(engine.url, "vllm:num_requests_running")
            + await _gauge(engine.url, "vllm:num_requests_waiting"))


async def _post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/completions", json=body) as r:
        return r.status, await r.read()


async def _fault(engine: Proc, fault: dict[str, Any]) -> None:
    async with aiohttp.ClientSession() as s, s.post(engine.url + "/sim/fault", json=fault) as r:
        assert r.status == 200, await r.text()


async def test_a_client_gone_before_the_head_stops_its_request_on_the_stream(fleet: Fleet) -> None:
    # Prefill takes 20 s or more: the head is far off, and the deadline (8 s) too.
    await _fault(fleet.prefill, {"mode": "slow", "factor": 10000})
    try:
        async with aiohttp.ClientSession() as s:
            with pytest.raises(asyncio.TimeoutError):
                await s.post(fleet.gateway.url + "/v1/completions", json=SMALL,
                             timeout=aiohttp.ClientTimeout(total=1.0))
        # The coordinator and the engine stop the request well before its deadline.
        await wait_for(lambda: _stopped(fleet), timeout=REQUEST_TIMEOUT - 4,
                       what="the request stopped at the coordinator and the engine after its client left")
    finally:
        await _fault(fleet.prefill, {"mode": "none"})
    assert (await _post(fleet.gateway.url, SMALL))[0] == 200


async def _stopped(fleet: Fleet) -> bool:
    return await _coordinator_in_flight(fleet) == 0 and await _engine_requests(fleet.prefill) == 0


async def test_a_client_that_stops_reading_is_cut_off_at_the_deadline(fleet: Fleet) -> None:
    slow = await SlowClient.post(fleet.gateway.url, "/v1/completions", BIG)
    try:
        head_bytes = await asyncio.wait_for(slow.head(), 30)
        assert head_bytes.startswith(b"HTTP/1.1 200")
        # The client reads nothing more; its request holds the model's only slot.
        status, body = await _post(fleet.gateway.url, SMALL)
        assert status == 429, body
        # Once the deadline passed the connection is closed and the slot free again.
        await wait_for(lambda: _admitted(fleet), timeout=REQUEST_TIMEOUT + STALL_GRACE_SEC + 10,
                       what="a new request admitted after the stalled one's deadline")
        assert await _coordinator_in_flight(fleet) == 0
        assert await _engine_requests(fleet.decode) == 0
    finally:
        slow.close()


async def _admitted(fleet: Fleet) -> bool:
    return (await _post(fleet.gateway.url, SMALL))[0] == 200


def _endless_sse(cancelled: list[int]) -> Any:
    async def script(request: cpb.DispatchRequest, context: Any) -> AsyncIterator[cpb.DispatchResponse]:
        yield head(200, "text/event-stream")
        try:
            while True:
                yield chunk(b"data: " + b"x" * 65536 + b"\n\n")
        except (asyncio.CancelledError, GeneratorExit):
            cancelled.append(1)
            raise

    return script


async def test_the_colocated_front_closes_the_engine_stream_of_a_client_that_stops_reading() -> None:
    async with in_process_gateway(request_timeout=1.0, admission=AdmissionConfig(**ONE_AT_A_TIME)) as (url, fake):
        closed: list[int] = []
        fake.script = _endless_sse(closed)
        slow = await SlowClient.post(url, "/v1/completions", {**SMALL, "stream": True})
        try:
            assert (await asyncio.wait_for(slow.head(), 10)).startswith(b"HTTP/1.1 200")
            fake.script = replay(head(), chunk(b'{"ok": true}'))
            assert (await _post(url, SMALL))[0] == 429  # the stalled request holds the slot
            await wait_for(lambda: bool(closed), timeout=1.0 + STALL_GRACE_SEC + 10,
                           what="the stalled request's engine stream closed after its deadline")
            status, body = await _post(url, SMALL)
            assert (status, body) == (200, b'{"ok": true}')
        finally:
            slow.close()
