"""A prompt far beyond max_model_len is refused like vLLM does (400, its message and param) in
bounded time, and the simulator keeps answering /health meanwhile (a 60 MB prompt used to hold
its event loop for half a minute, failing health checks until its node was restarted)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import aiohttp
import orjson
import pytest

from .conftest import SimFactory, SimProc

BIG = 60 * 1024 * 1024


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def sim(request: pytest.FixtureRequest, module_sims: SimFactory) -> Iterator[SimProc]:
    if request.param == "vllm":
        yield module_sims.vllm("--max-model-len", "512")
    else:
        yield module_sims.sglang("--context-length", "512")


async def _health_latencies(sim: SimProc, stop: asyncio.Event) -> list[float]:
    out: list[float] = []
    async with aiohttp.ClientSession() as s:
        while not stop.is_set():
            t = time.monotonic()
            async with s.get(sim.url + "/health", timeout=aiohttp.ClientTimeout(total=10)) as r:
                assert r.status == 200
            out.append(time.monotonic() - t)
            await asyncio.sleep(0.05)
    return out


@pytest.mark.parametrize("kind", ["text", "token_ids", "chat"])
async def test_huge_prompt_is_400_quickly_and_health_stays_responsive(sim: SimProc, kind: str) -> None:
    if kind == "text":
        path, body = "/v1/completions", {"model": "sim-model", "prompt": "hello world, " * (BIG // 13)}
    elif kind == "token_ids":
        path, body = "/v1/completions", {"model": "sim-model", "prompt": list(range(BIG // 8))}
    else:
        path, body = "/v1/chat/completions", {"model": "sim-model",
                                              "messages": [{"role": "user", "content": "hi there " * (BIG // 9)}]}
    data = orjson.dumps(body)
    stop = asyncio.Event()
    health = asyncio.create_task(_health_latencies(sim, stop))
    start = time.monotonic()
    async with aiohttp.ClientSession() as s, s.post(sim.url + path, data=data,
                                                     headers={"Content-Type": "application/json"},
                                                     timeout=aiohttp.ClientTimeout(total=60)) as r:
        status, err = r.status, orjson.loads(await r.read())
    elapsed = time.monotonic() - start
    stop.set()
    latencies = await health
    assert status == 400
    message = err["error"]["message"] if "error" in err else err["message"]
    assert "maximum context length is 512 tokens" in message
    # Wall-clock bounds with room for a box loaded 3x more than the 5-6 s seen at load 14: the bug
    # this guards against held the loop for ~30 s on a quiet box, which the /health reads (each
    # bounded at 10 s above) catch whatever the load; the refusal itself is bounded only loosely.
    assert elapsed < 40, f"refusal took {elapsed:.1f}s"
    assert latencies and max(latencies) < 8, f"/health stalled {max(latencies):.1f}s"
