"""The SGLang flavour: OpenAI surface, error/metric shapes and bootstrap-room PD hand-off."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import aiohttp
import openai
import pytest

from .conftest import SimFactory, SimProc

TIMEOUT = aiohttp.ClientTimeout(total=15)
PROMPT = "SGLang sends the same request to prefill and decode at once"


async def post(sim: SimProc, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s, s.post(sim.v1 + path, json=body) as r:
        return r.status, await r.json()


async def test_sglang_surface_shapes(sims: SimFactory) -> None:
    u = sims.sglang("--sim-decode-ms-per-token", "0.5")
    c = openai.AsyncOpenAI(base_url=u.v1, api_key="x", max_retries=0, timeout=10)
    r = await c.chat.completions.create(model="whatever", messages=[{"role": "user", "content": "hi"}],
                                        max_tokens=3)
    assert r.choices[0].finish_reason == "length" and r.usage and r.usage.completion_tokens == 3
    assert r.choices[0].model_extra is not None and "matched_stop" in r.choices[0].model_extra
    text = ""
    stream = await c.completions.create(model="x", prompt="hello", max_tokens=4, stream=True,
                                        stream_options={"include_usage": True})
    usage = None
    async for chunk in stream:
        text += "".join(ch.text for ch in chunk.choices)
        usage = chunk.usage or usage
    assert len(text.split()) == 4 and usage is not None and usage.total_tokens == 5
    models = await c.models.list()
    assert models.data[0].id == "sim-model" and models.data[0].owned_by == "sglang"
    status, body = await post(u, "/completions", {"prompt": "x", "max_tokens": -1})
    assert status == 400 and body["object"] == "error" and body["code"] == 400
    assert set(body) == {"object", "message", "type", "param", "code"}
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        async with s.get(u.url + "/metrics") as resp:
            m = await resp.text()
        async with s.get(u.url + "/health") as resp:
            assert resp.status == 200
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"):
        assert name + '{model_name="sim-model"}' in m


@pytest.mark.slow
async def test_prefill_and_decode_concurrently_equal_union(sims: SimFactory) -> None:
    p = sims.sglang(mode="prefill")
    d = sims.sglang(mode="decode")
    u = sims.sglang()
    room = random.getrandbits(63)
    body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 9, "seed": 11,
            "bootstrap_host": "127.0.0.1", "bootstrap_port": p.ports["bootstrap"],
            "bootstrap_room": room}
    (ps, presp), (ds, dresp), (_, uresp) = await asyncio.gather(
        post(p, "/completions", body), post(d, "/completions", body),
        post(u, "/completions", {k: v for k, v in body.items() if not k.startswith("bootstrap")}))
    assert ps == 200 and ds == 200
    assert presp["choices"][0]["finish_reason"] == "length"
    assert presp["usage"]["completion_tokens"] == 1
    assert dresp["choices"][0]["text"] == uresp["choices"][0]["text"]
    assert dresp["usage"] == uresp["usage"]
    assert presp["choices"][0]["text"] == " " + uresp["choices"][0]["text"].split()[0]


@pytest.mark.slow
async def test_streaming_chat_decode_equals_union(sims: SimFactory) -> None:
    p = sims.sglang(mode="prefill")
    d = sims.sglang(mode="decode")
    u = sims.sglang()
    msgs = [{"role": "user", "content": PROMPT}]
    boot = {"bootstrap_host": "127.0.0.1", "bootstrap_port": p.ports["bootstrap"],
            "bootstrap_room": 42}
    body = {"messages": msgs, "max_tokens": 6, "stream": True}

    async def stream_text(sim: SimProc, b: dict[str, Any]) -> str:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as s, s.post(sim.v1 + "/chat/completions",
                                                                       json=b) as r:
            assert r.status == 200
            raw = (await r.read()).decode()
        out = ""
        for e in raw.split("\n\n"):
            if e.startswith("data: {"):
                for ch in json.loads(e[6:])["choices"]:
                    out += ch["delta"].get("content") or ""
        return out

    _, dtext, utext = await asyncio.gather(stream_text(p, dict(body, **boot)),
                                           stream_text(d, dict(body, **boot)),
                                           stream_text(u, body))
    assert dtext == utext and len(utext.split()) == 6


@pytest.mark.slow
async def test_decode_without_prefill_times_out_with_sglang_error(sims: SimFactory) -> None:
    p = sims.sglang(mode="prefill")
    d = sims.sglang("--sim-waiting-timeout-s", "0.5", mode="decode")
    body = {"prompt": PROMPT, "max_tokens": 3, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": p.ports["bootstrap"], "bootstrap_room": 7}
    status, err = await post(d, "/completions", body)
    assert status == 500 and err["object"] == "error" and err["code"] == 500
    assert err["message"].startswith("Decode transfer failed for request")
    assert "bootstrap_room=7" in err["message"] and "timed out" in err["message"]


@pytest.mark.slow
async def test_dead_prefill_and_missing_room_are_refused(sims: SimFactory) -> None:
    from .conftest import free_port

    d = sims.sglang(mode="decode")
    body = {"prompt": "x", "max_tokens": 2, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": free_port(), "bootstrap_room": 1}
    status, err = await post(d, "/completions", body)
    assert status == 500 and "it might be dead" in err["message"]
    status, err = await post(d, "/completions", {"prompt": "x"})
    assert status == 400 and "without bootstrap room id" in err["message"]
    p = sims.sglang("--sim-bootstrap-timeout-s", "0.3", mode="prefill")
    status, err = await post(p, "/completions", {"prompt": "x", "bootstrap_room": 3,
                                                 "bootstrap_host": "127.0.0.1"})
    assert status == 500 and err["message"].startswith("Prefill transfer failed")
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s, s.get(p.url + "/sim/state") as r:
        st = await r.json()
    assert st["kv"]["used"] == 0 and st["kv"]["rooms"] == 0
