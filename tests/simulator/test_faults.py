"""Fault injection through flags and the /sim/fault admin endpoint, on real processes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson
import pytest
import zmq
import zmq.asyncio

from tests.helpers import wait_for

from .conftest import SimFactory, SimProc, free_port, http_status, wait_healthy

TIMEOUT = aiohttp.ClientTimeout(total=5)


async def set_fault(sim: SimProc, **body: Any) -> None:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s, s.post(sim.url + "/sim/fault",
                                                                   json=body) as r:
        assert r.status == 200, await r.text()


async def complete(sim: SimProc, **extra: Any) -> dict[str, Any]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s, s.post(
        sim.v1 + "/completions", json={"prompt": "fault probe", "max_tokens": 4, **extra}
    ) as r:
        data: dict[str, Any] = await r.json()
        return data


async def test_health_503_then_recovery(sims: SimFactory) -> None:
    sim = sims.vllm("--sim-zero-latency")
    await set_fault(sim, mode="health_503")
    assert http_status(sim.url + "/health", timeout=10) == 503
    await set_fault(sim, mode="none")
    assert http_status(sim.url + "/health", timeout=10) == 200


async def test_wrong_answers_change_the_text_deterministically(sims: SimFactory) -> None:
    sim = sims.sglang("--sim-zero-latency")
    good = (await complete(sim))["choices"][0]["text"]
    await set_fault(sim, mode="wrong_answers")
    bad1 = (await complete(sim))["choices"][0]["text"]
    bad2 = (await complete(sim))["choices"][0]["text"]
    assert bad1 == bad2 != good
    await set_fault(sim, mode="none")
    assert (await complete(sim))["choices"][0]["text"] == good


async def test_hang_stops_answering_but_keeps_the_process_alive(sims: SimFactory) -> None:
    sim = sims.vllm("--sim-zero-latency")
    await set_fault(sim, mode="hang")
    assert http_status(sim.url + "/health", timeout=0.3) is None
    with pytest.raises(asyncio.TimeoutError):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.3)) as s:
            await s.post(sim.v1 + "/completions", json={"prompt": "x"})
    assert sim.proc.poll() is None
    await set_fault(sim, mode="none")
    assert http_status(sim.url + "/health", timeout=10) == 200


async def test_slow_multiplies_latency(sims: SimFactory) -> None:
    """No comparison with a measured fast request (a load spike on that one made it look as slow
    as the slowed one): 10 tokens at 20 ms per decode step are >= 9 steps of 20 ms unslowed, and
    slowed tenfold >= 9 steps of 200 ms, a floor the engine's own sleeps guarantee on any box."""
    sim = sims.vllm("--sim-decode-ms-per-token", "20", "--sim-decode-ms-per-seq", "0")
    assert len((await complete(sim, max_tokens=10))["choices"][0]["text"].split()) == 10
    await set_fault(sim, mode="slow", factor=10)
    t0 = time.monotonic()
    assert len((await complete(sim, max_tokens=10))["choices"][0]["text"].split()) == 10
    assert time.monotonic() - t0 >= 9 * 0.2


async def test_crash_exits_non_zero(sims: SimFactory) -> None:
    sim = sims.vllm("--sim-zero-latency")
    await set_fault(sim, mode="crash", exit_code=3)
    assert sim.proc.wait(timeout=30) == 3


def test_crash_after_flag_exits_by_itself(sims: SimFactory) -> None:
    sim = sims.sglang("--sim-crash-after-s", "0.3")
    assert sim.proc.wait(timeout=30) == 1


async def test_bad_fault_body_is_rejected(sims: SimFactory) -> None:
    sim = sims.vllm("--sim-zero-latency")
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s, s.post(
        sim.url + "/sim/fault", json={"mode": "explode"}
    ) as r:
        assert r.status == 400


async def test_sigterm_shuts_down_cleanly(sims: SimFactory) -> None:
    sim = sims.vllm("--sim-zero-latency", role="kv_producer")
    sim.proc.terminate()
    assert sim.proc.wait(timeout=30) == 0
    assert "shutting down" in sim.log()


@pytest.mark.slow
async def test_zmq_fault_topic_and_fault_tolerance_endpoints(sims: SimFactory) -> None:
    base = free_port()
    sim = sims.vllm("--sim-zero-latency", "--sim-zmq-pub-port", str(base), "--sim-zmq-interval-s",
                    "0.1", "--data-parallel-size", "4", "--data-parallel-rank", "0")
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(f"tcp://127.0.0.1:{base}")
    sub.setsockopt(zmq.SUBSCRIBE, b"vllm_fault")
    try:
        topic, raw = await asyncio.wait_for(sub.recv_multipart(), 5)
        assert topic == b"vllm_fault" and orjson.loads(raw)["status"] == "healthy"
        await set_fault(sim, mode="health_503")
        deadline = time.monotonic() + 5
        status = "healthy"
        while status != "unhealthy" and time.monotonic() < deadline:
            _, raw = await asyncio.wait_for(sub.recv_multipart(), 5)
            status = orjson.loads(raw)["status"]
        assert status == "unhealthy"
    finally:
        sub.close(0)
        ctx.term()
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        async with s.post(sim.url + "/fault_tolerance/apply",
                          json={"instruction": "scale_down", "params": {"dead_ranks": [2]}}) as r:
            assert r.status == 202 and (await r.json())["request_id"]
        async with s.post(sim.url + "/fault_tolerance/apply", json={"dead_ranks": [2]}) as r:
            assert r.status == 400  # vLLM's contract: instruction + params
        async with s.get(sim.url + "/fault_tolerance/status") as r:
            body = await r.json()
            assert body["active_dp_ranks"] == [0, 1, 3] and body["dp_size"] == 3
        async with s.get(sim.url + "/fault_tolerance/status") as r:
            assert (await r.json())["status"] == "unhealthy"


async def test_dp_survivor_is_unhealthy_when_a_peer_rank_dies_until_scale_down(sims: SimFactory) -> None:
    """The emulated DP group: kill rank 1 → rank 0 reports unhealthy; scale_down [1] → healthy."""
    rpc = free_port()
    common = ("--sim-zero-latency", "--sim-zmq-pub-port", str(free_port()), "--data-parallel-size", "2",
              "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", str(rpc))
    r0 = sims.spawn("vllm", "serve", "sim-model", *common, "--data-parallel-rank", "0")
    r1 = sims.spawn("vllm", "serve", "sim-model", *common, "--data-parallel-rank", "1")
    wait_healthy(r0)  # healthy only once the DP group is formed (both ranks joined)
    wait_healthy(r1)

    async def status() -> dict[str, Any]:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as s, s.get(r0.url + "/fault_tolerance/status") as r:
            return dict(await r.json())

    assert (await status())["status"] == "healthy"
    async def status_is(want: str) -> dict[str, Any] | None:
        st = await status()
        return st if st["status"] == want else None

    r1.proc.kill()
    await wait_for(lambda: status_is("unhealthy"), timeout=20, what="the survivor noticing the dead peer")
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        async with s.post(r0.url + "/fault_tolerance/apply",
                          json={"instruction": "scale_down", "params": {"dead_ranks": [1]}}) as r:
            assert r.status == 202
    st = await wait_for(lambda: status_is("healthy"), timeout=20, what="the survivor healthy on rank 0 alone")
    assert st["active_dp_ranks"] == [0]
