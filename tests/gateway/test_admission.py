"""Admission control: bounded concurrency and queues per model and per API key, 429 + Retry-After
when full, FIFO grants, no leaked slots or buckets. Pure tests (asyncio, no sockets) and one
through the real HTTP front with real concurrent clients."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.openai_front.admission import Admission, AdmissionConfig, BodyBudget, Hold, Shed
from motor_gateway.config import GatewayConfig
from tests.gateway.fakes import chunk, fake_coordinator, head, in_process_gateway, running_gateway
from tests.gateway.test_dispatch import assert_openai_error
from tests.helpers import wait_for

CFG = AdmissionConfig(max_in_flight_per_model=2, max_queued_per_model=2, max_in_flight_per_key=3,
                      max_queued_per_key=3, queue_timeout_sec=5.0)


async def test_requests_beyond_in_flight_wait_and_beyond_the_queue_are_shed() -> None:
    adm = Admission(CFG)
    a = await adm.acquire("m", "k", 10)
    b = await adm.acquire("m", "k", 10)
    waiting = [asyncio.create_task(adm.acquire("m", "k", 10)) for _ in range(2)]
    await wait_for(lambda: adm.queued("m") == 2, timeout=2, what="two queued")
    with pytest.raises(Shed) as shed:
        await adm.acquire("m", "k", 10)
    assert shed.value.reason == "queue_full"
    assert adm.in_flight("m") == 2 and adm.queued("m") == 2
    adm.release(a)
    first = await asyncio.wait_for(waiting[0], 1)  # FIFO: the first waiter gets the slot
    assert not waiting[1].done()
    for t in (b, first):
        adm.release(t)
    adm.release(await asyncio.wait_for(waiting[1], 1))
    assert adm.in_flight("m") == 0 and adm.queued("m") == 0
    assert adm._models == {} and adm._keys == {} and adm.queued_bytes == 0  # nothing left behind


async def test_per_key_bound_applies_across_models() -> None:
    adm = Admission(CFG)
    tickets = [await adm.acquire(f"m{i}", "tenant-a", 1) for i in range(3)]
    task = asyncio.create_task(adm.acquire("m9", "tenant-a", 1))
    await wait_for(lambda: adm._keys["tenant-a"].queued == 1, timeout=2, what="key queue")
    other = await asyncio.wait_for(adm.acquire("m9", "tenant-b", 1), 1)  # another key is not held up
    adm.release(tickets[0])
    adm.release(await asyncio.wait_for(task, 1))
    for t in (*tickets[1:], other):
        adm.release(t)
    assert adm._keys == {}


async def test_queue_timeout_sheds_and_frees_the_queue_place() -> None:
    adm = Admission(AdmissionConfig(max_in_flight_per_model=1, max_queued_per_model=1, queue_timeout_sec=0.2))
    held = await adm.acquire("m", "k", 1)
    with pytest.raises(Shed) as shed:
        await adm.acquire("m", "k", 1)
    assert shed.value.reason == "queue_timeout"
    assert adm.queued("m") == 0
    adm.release(held)
    adm.release(await adm.acquire("m", "k", 1))
    assert adm._models == {}


async def test_cancelled_waiter_leaves_the_queue() -> None:
    adm = Admission(CFG)
    held = [await adm.acquire("m", "k", 1) for _ in range(2)]
    task = asyncio.create_task(adm.acquire("m", "k", 1))
    await wait_for(lambda: adm.queued("m") == 1, timeout=2, what="queued")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert adm.queued("m") == 0 and adm.queued_bytes == 0
    for t in held:
        adm.release(t)
    assert adm._models == {}


def test_body_budget_refuses_beyond_the_limit_but_never_a_lone_request() -> None:
    budget = BodyBudget(100)
    a, b = Hold(budget), Hold(budget)
    a.take(80)
    with pytest.raises(Shed) as shed:
        b.take(30)
    assert shed.value.reason == "buffered_bytes"
    a.take(500)  # the only holder may grow past the limit (one request is always possible)
    a.free()
    b.take(30)
    b.free()
    assert budget.used == 0


# --- through the HTTP front with concurrent clients -----------------------------------------


@pytest.fixture(params=["grpc", "in_process"])
async def gated(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A front with CFG-like admission whose coordinator holds every request until ``gate`` is set."""
    cfg = AdmissionConfig(max_in_flight_per_model=2, max_queued_per_model=2, queue_timeout_sec=10.0,
                          retry_after_sec=3)
    gate = asyncio.Event()

    async def script(req: cpb.DispatchRequest, context: Any) -> Any:
        await gate.wait()
        yield head(200)
        yield chunk(b'{"ok": true}')

    if request.param == "in_process":
        async with in_process_gateway(admission=cfg) as (url, fake):
            fake.script = script
            yield url, fake, gate
        return
    async with fake_coordinator() as (addr, fake):
        fake.script = script
        async with running_gateway(GatewayConfig(coordinators=(addr,), admission=cfg), tmp_path) as url:
            yield url, fake, gate


async def test_overload_is_answered_429_with_retry_after_and_admitted_requests_complete(gated: Any) -> None:
    url, fake, gate = gated
    body = orjson.dumps({"model": "tiny", "prompt": "x"})
    async with aiohttp.ClientSession() as http:

        async def one() -> tuple[int, dict[str, Any], str | None]:
            async with http.post(f"{url}/v1/completions", data=body) as r:
                return r.status, await r.json(), r.headers.get("Retry-After")

        tasks = [asyncio.create_task(one()) for _ in range(8)]
        await wait_for(lambda: len(fake.requests) == 2, timeout=10, what="two requests at the coordinator")
        done = await wait_for(lambda: [t for t in tasks if t.done()] if sum(t.done() for t in tasks) == 4 else None,
                              timeout=10, what="four requests shed")
        for t in done:
            status, err, retry = t.result()
            assert status == 429 and retry == "3"
            assert_openai_error(err, "rate_limit_error")
            assert err["error"]["code"] == "queue_full"
        assert len(fake.requests) == 2  # the engines never saw more than the bound
        gate.set()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert sorted(s for s, _, _ in results) == [200] * 4 + [429] * 4
        assert len(fake.requests) == 4
        async with http.get(f"{url}/metrics") as r:
            text = await r.text()
    assert 'motor_gateway_admission_shed_total{reason="queue_full"}' in text
    assert "motor_gateway_admission_queue_length 0.0" in text


async def test_in_flight_byte_budget_makes_large_bodies_wait_in_order() -> None:
    adm = Admission(AdmissionConfig(max_in_flight_bytes=100))
    big = await adm.acquire("m", "k", 90)  # the first is always admitted
    alone = Admission(AdmissionConfig(max_in_flight_bytes=100))
    adm.release(await adm.acquire("m", "k", 10))  # fits beside it
    alone.release(await alone.acquire("m", "k", 500))  # larger than the budget, but alone: admitted
    waiting = asyncio.create_task(adm.acquire("m", "k", 50))
    await wait_for(lambda: adm.queued("m") == 1, timeout=2, what="large body queued")
    small = asyncio.create_task(adm.acquire("m", "k", 5))  # would fit, but must not overtake
    await wait_for(lambda: adm.queued("m") == 2, timeout=2, what="small body queued behind")
    adm.release(big)
    first = await asyncio.wait_for(waiting, 1)
    second = await asyncio.wait_for(small, 1)
    assert adm.in_flight_bytes == 55
    for t in (first, second):
        adm.release(t)
    assert adm.in_flight_bytes == 0 and adm._models == {}
