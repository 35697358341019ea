"""The vLLM flavour's OpenAI surface, driven through the openai SDK against a real process."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest

from tests.helpers import wait_for

from .conftest import SimFactory, SimProc


@pytest.fixture(scope="module")
def vllm(module_sims: SimFactory) -> Iterator[SimProc]:
    yield module_sims.vllm("--served-model-name", "sim-model", "alias", "--max-model-len", "512",
                           "--sim-decode-ms-per-token", "1", "--sim-num-kv-blocks", "256")


def client(sim: SimProc) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=sim.v1, api_key="x", max_retries=0, timeout=10)


async def metric(sim: SimProc, name: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(sim.url + "/metrics",
                                                   timeout=aiohttp.ClientTimeout(total=5)) as r:
        text = await r.text()
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics:\n{text}")


async def test_completion_is_deterministic_with_usage_and_length_finish(vllm: SimProc) -> None:
    c = client(vllm)
    a = await c.completions.create(model="sim-model", prompt="The quick brown fox", max_tokens=6,
                                   seed=42)
    b = await c.completions.create(model="sim-model", prompt="The quick brown fox", max_tokens=6,
                                   seed=42)
    assert a.choices[0].text == b.choices[0].text and len(a.choices[0].text.split()) == 6
    assert a.choices[0].finish_reason == "length"
    assert a.id.startswith("cmpl-") and a.object == "text_completion" and a.model == "sim-model"
    assert a.usage is not None
    assert (a.usage.prompt_tokens, a.usage.completion_tokens, a.usage.total_tokens) == (4, 6, 10)
    other = await c.completions.create(model="sim-model", prompt="The quick brown fox",
                                       max_tokens=6, seed=43)
    assert other.choices[0].text != a.choices[0].text


async def test_stop_string_gives_finish_reason_stop(vllm: SimProc) -> None:
    c = client(vllm)
    full = (await c.completions.create(model="sim-model", prompt="stop me", max_tokens=8)).choices[0].text
    stop = full.split()[2]
    got = await c.completions.create(model="sim-model", prompt="stop me", max_tokens=8,
                                     stop=[" " + stop])
    ch = got.choices[0]
    assert ch.finish_reason == "stop" and ch.text == full[: full.index(" " + stop)]
    assert ch.model_extra is not None and ch.model_extra["stop_reason"] == " " + stop


async def test_streaming_completion_matches_non_streaming_and_reports_usage(vllm: SimProc) -> None:
    c = client(vllm)
    whole = await c.completions.create(model="sim-model", prompt="stream this", max_tokens=5)
    text, usage, finish = "", None, None
    stream = await c.completions.create(model="sim-model", prompt="stream this", max_tokens=5,
                                        stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert text == whole.choices[0].text and finish == "length"
    assert usage is not None and usage.completion_tokens == 5


async def test_chat_streaming_role_first_then_content(vllm: SimProc) -> None:
    c = client(vllm)
    msgs = [{"role": "user", "content": "Say something"}]
    whole = await c.chat.completions.create(model="alias", messages=msgs,  # type: ignore[arg-type]
                                            max_completion_tokens=4)
    assert whole.choices[0].message.role == "assistant" and whole.id.startswith("chatcmpl-")
    roles, content = [], ""
    stream = await c.chat.completions.create(model="alias", messages=msgs,  # type: ignore[arg-type]
                                             max_tokens=4, stream=True)
    async for chunk in stream:
        for ch in chunk.choices:
            if ch.delta.role:
                roles.append(ch.delta.role)
            content += ch.delta.content or ""
    assert roles == ["assistant"] and content == whole.choices[0].message.content


async def test_n_choices_and_logprobs(vllm: SimProc) -> None:
    c = client(vllm)
    r = await c.completions.create(model="sim-model", prompt="many", max_tokens=3, n=3,
                                   logprobs=2, temperature=0.8)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert r.usage is not None and r.usage.completion_tokens == 9
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and len(lp.tokens) == 3
    assert lp.top_logprobs is not None and len(lp.top_logprobs[0]) == 2
    chat = await c.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "x"}], max_tokens=2,
        logprobs=True, top_logprobs=3)
    assert chat.choices[0].logprobs is not None
    content = chat.choices[0].logprobs.content
    assert content is not None and len(content) == 2 and len(content[0].top_logprobs) == 3


async def test_errors_use_vllm_error_response_shape(vllm: SimProc) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(vllm.v1 + "/completions", json={"model": "nope", "prompt": "x"}) as r:
            assert r.status == 404
            assert await r.json() == {"error": {
                "message": "The model `nope` does not exist. Valid aliases: sim-model, alias.",
                "type": "NotFoundError", "param": "model", "code": 404}}
        async with s.post(vllm.v1 + "/completions", json={"prompt": "x", "max_tokens": 10_000}) as r:
            body = await r.json()
            assert r.status == 400 and body["error"] == {
                "message": "max_tokens=10000 cannot be greater than max_model_len=512. Please request "
                           "fewer output tokens. (parameter=max_tokens, value=10000)",
                "type": "BadRequestError", "param": "max_tokens", "code": 400}
        # vLLM 0.32 clamps max_tokens to the room left in the context instead of refusing
        async with s.post(vllm.v1 + "/completions",
                          json={"prompt": "a b c d", "max_tokens": 511}) as r:
            body = await r.json()
            assert r.status == 200 and body["usage"]["completion_tokens"] == 508
        async with s.post(vllm.v1 + "/completions", json={"prompt": "x " * 600, "max_tokens": 1}) as r:
            body = await r.json()
            assert r.status == 400 and body["error"]["param"] == "input_tokens"
        async with s.post(vllm.v1 + "/completions", json={"prompt": "x", "max_tokens": "a"}) as r:
            body = await r.json()
            assert r.status == 400 and body["error"]["type"] == "Bad Request"
            assert body["error"]["param"] == "body.max_tokens"
            assert body["error"]["message"].startswith("1 validation error:")
        async with s.get(vllm.url + "/nope") as r:
            assert r.status == 404 and await r.json() == {"detail": "Not Found"}
    with pytest.raises(openai.BadRequestError):
        await client(vllm).completions.create(model="sim-model", prompt="x", max_tokens=0)


async def test_request_id_header_names_the_response_but_is_not_echoed_by_default(
    vllm: SimProc,
) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(vllm.v1 + "/completions", json={"prompt": "x", "max_tokens": 1},
                          headers={"X-Request-Id": "abc-123"}) as r:
            assert "X-Request-Id" not in r.headers
            assert (await r.json())["id"] == "cmpl-abc-123"
        async with s.post(vllm.v1 + "/completions", json={"prompt": "x", "max_tokens": 1}) as r:
            assert len((await r.json())["id"]) == len("cmpl-") + 16


async def test_request_id_headers_flag_echoes_on_every_response(sims: SimFactory) -> None:
    sim = sims.vllm("--served-model-name", "m", "--enable-request-id-headers")
    async with aiohttp.ClientSession() as s:
        async with s.post(sim.v1 + "/completions", json={"prompt": "x", "max_tokens": 1},
                          headers={"X-Request-Id": "abc-123"}) as r:
            assert r.headers["X-Request-Id"] == "abc-123"
        async with s.post(sim.v1 + "/completions", json={"model": "nope", "prompt": "x"},
                          headers={"X-Request-Id": "err-1"}) as r:
            assert r.status == 404 and r.headers["X-Request-Id"] == "err-1"
        async with s.get(sim.url + "/health") as r:
            assert len(r.headers["X-Request-Id"]) == 32


async def test_models_health_version_and_tcp_nodelay(vllm: SimProc) -> None:
    models = await client(vllm).models.list()
    assert [m.id for m in models.data] == ["sim-model", "alias"]
    assert models.data[0].owned_by == "vllm"
    async with aiohttp.ClientSession() as s:
        async with s.get(vllm.url + "/health") as r:
            assert r.status == 200 and await r.read() == b""
        async with s.get(vllm.url + "/version") as r:
            assert "version" in await r.json()
        async with s.get(vllm.url + "/sim/state") as r:
            assert (await r.json())["tcp_nodelay"] is True


async def test_sse_framing_is_data_lines_and_done(vllm: SimProc) -> None:
    async with aiohttp.ClientSession() as s, s.post(
        vllm.v1 + "/completions", json={"prompt": "x", "max_tokens": 2, "stream": True}
    ) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = (await r.read()).decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(e.startswith("data: {") for e in events[:-2])


async def test_client_disconnect_aborts_and_frees_kv_blocks(vllm: SimProc) -> None:
    # 200 tokens at >= 1 ms each: still running when we hang up
    async with aiohttp.ClientSession() as s:
        async with s.post(vllm.v1 + "/completions",
                          json={"prompt": "long one", "max_tokens": 400, "stream": True}) as r:
            await r.content.readline()
            assert await metric(vllm, "vllm:num_requests_running") == 1
            assert await metric(vllm, "vllm:kv_cache_usage_perc") > 0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if (await metric(vllm, "vllm:num_requests_running") == 0
                and await metric(vllm, "vllm:kv_cache_usage_perc") == 0):
            break
        await asyncio.sleep(0.02)
    assert await metric(vllm, "vllm:kv_cache_usage_perc") == 0
    assert await metric(vllm, "motor_sim:requests_aborted_total") >= 1


async def test_repeated_prefix_hits_the_prefix_cache(vllm: SimProc) -> None:
    prompt = " ".join(f"w{i}" for i in range(64))
    before = await metric(vllm, "vllm:prefix_cache_hits_total")
    c = client(vllm)
    await c.completions.create(model="sim-model", prompt=prompt, max_tokens=1)
    await c.completions.create(model="sim-model", prompt=prompt + " more", max_tokens=1)
    assert await metric(vllm, "vllm:prefix_cache_hits_total") - before >= 48


async def post_json(sim: SimProc, path: str, body: dict[str, object], timeout: float = 10) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as s, s.post(sim.v1 + path, json=body,
                                                    timeout=aiohttp.ClientTimeout(total=timeout)) as r:
        return r.status, await r.json()


async def test_logprobs_above_max_logprobs_is_refused_with_vllms_400(vllm: SimProc) -> None:
    # issue 12: this request used to spin the engine's event loop for ever (more alternatives
    # asked than the vocabulary has); vLLM refuses it before any work (--max-logprobs, 20).
    status, body = await post_json(vllm, "/completions",
                                   {"model": "sim-model", "prompt": "p", "max_tokens": 2, "logprobs": 1000})
    assert status == 400
    assert body == {"error": {
        "message": "Requested sample logprobs of 1000, which is greater than max allowed: 20 "
                   "(parameter=logprobs, value=1000)",
        "type": "BadRequestError", "param": "logprobs", "code": 400}}
    status, body = await post_json(vllm, "/chat/completions", {
        "model": "sim-model", "messages": [{"role": "user", "content": "p"}], "max_tokens": 2,
        "logprobs": True, "top_logprobs": 21})
    assert status == 400 and body["error"]["param"] == "logprobs"  # type: ignore[index]
    assert "Requested sample logprobs of 21, which is greater than max allowed: 20" in str(body)
    # -1 means the whole vocabulary, also over the limit; 20 is served with 20 alternatives
    status, body = await post_json(vllm, "/completions",
                                   {"model": "sim-model", "prompt": "p", "max_tokens": 2, "logprobs": -1})
    assert status == 400 and body["error"]["param"] == "logprobs"  # type: ignore[index]
    r = await client(vllm).completions.create(model="sim-model", prompt="p", max_tokens=2, logprobs=20)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.top_logprobs is not None
    assert [len(t) for t in lp.top_logprobs] == [20, 20]


async def test_one_heavy_request_does_not_stall_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 10 MB prompt is refused for its length, and while it is decoded and tokenized /health and
    other requests are answered: its CPU work runs off the event loop.

    No wall-clock bound (a light request's latency on a loaded box says nothing): the heavy body's
    parse is held at a gate (an in-process engine, its real ``_parse_job`` behind the gate) that
    only the test opens, and only after light requests were answered meanwhile. Were the parse on
    the event loop, the gate would block the loop, nothing could be answered, and the gate would
    time out instead of being opened."""
    from motor_sim import server as sim_server
    from motor_sim.cli import parse

    parsing, gate = threading.Event(), threading.Event()
    opened: list[bool] = []
    real_parse = sim_server._parse_job

    def gated(raw: bytes, kind: Any, max_model_len: int) -> Any:
        if len(raw) > 1_000_000:  # the heavy body only
            parsing.set()
            opened.append(gate.wait(10))  # False: nobody could open it (the event loop was blocked)
        return real_parse(raw, kind, max_model_len)

    monkeypatch.setattr(sim_server, "_parse_job", gated)
    engine = sim_server.SimServer(parse(["vllm", "serve", "sim-model", "--host", "127.0.0.1", "--port", "0",
                                         "--max-model-len", "512", "--sim-zero-latency"]))
    await engine.start()
    url = f"http://127.0.0.1:{engine.port}"
    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=10)
    try:
        async with aiohttp.ClientSession() as s:
            heavy = asyncio.ensure_future(s.post(
                url + "/v1/completions", json={"model": "sim-model", "prompt": "word " * 2_000_000, "max_tokens": 2},
                timeout=aiohttp.ClientTimeout(total=60)))
            try:
                await wait_for(parsing.is_set, timeout=30, what="the heavy body being parsed")
                async with s.get(url + "/health", timeout=aiohttp.ClientTimeout(total=10)) as r:
                    assert r.status == 200
                light = await c.completions.create(model="sim-model", prompt="light", max_tokens=2)
                assert light.choices[0].text
                assert not heavy.done() and not opened  # answered while the heavy one is parsed
            finally:
                gate.set()
            async with await heavy as r:
                status, body = r.status, await r.json()
        assert opened == [True]
        assert status == 400 and body["error"]["param"] == "input_tokens"
    finally:
        gate.set()
        await c.close()
        await engine.stop()
