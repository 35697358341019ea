"""Dispatch through a real ``motor-coordinator`` process to real ``motor-sim`` engines."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest

from motor_common.domain import Endpoint, EngineType, Instance, InstanceStatus, Role
from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.grpc_server import error_reason
from tests.coordinator.grpc_util import KEY, MD, Stubs
from tests.helpers import free_port, wait_for
from tests.procs import Proc, start_coordinator, start_simulator

pytestmark = pytest.mark.slow

MODEL = "sim-model"
COMPLETIONS = cpb.OPEN_AI_API_COMPLETIONS
CHAT = cpb.OPEN_AI_API_CHAT_COMPLETIONS
FAST = {"dispatch": {"health_probe_interval_sec": 0.2, "metrics_scrape_interval_sec": 0.2,
                     "circuit_breaker_cooldown_sec": 0.2, "connect_timeout_sec": 1.0}}


def instance(iid: int, role: Role, engine: EngineType, sims: list[Proc]) -> Instance:
    eps = tuple(
        Endpoint(i, "127.0.0.1", s.port, bootstrap_port=s.extra.get("bootstrap_port", 0)) for i, s in enumerate(sims)
    )
    return Instance(iid, role, f"job-{iid}", MODEL, engine, eps, InstanceStatus.AVAILABLE)


async def dispatch(s: Stubs, api: int, body: dict[str, Any], timeout: float = 30) -> tuple[cpb.ResponseHead, bytes]:
    head: cpb.ResponseHead | None = None
    chunks: list[bytes] = []
    call = s.dispatch.Dispatch(cpb.DispatchRequest(api=api, body=orjson.dumps(body)), timeout=timeout)
    async for frame in call:
        if frame.HasField("head"):
            assert head is None, "head must come exactly once, first"
            head = frame.head
        else:
            assert head is not None, "chunk before head"
            chunks.append(frame.chunk)
    assert head is not None
    return head, b"".join(chunks)


def direct(sim: Proc, path: str, body: dict[str, Any]) -> bytes:
    req = urllib.request.Request(sim.url + path, data=orjson.dumps(body), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return bytes(resp.read())


def sim_state(sim: Proc) -> dict[str, Any]:
    with urllib.request.urlopen(sim.url + "/sim/state", timeout=5) as resp:
        return dict(json.loads(resp.read()))


def text_of(api: int, raw: bytes, stream: bool) -> tuple[str, Any, Any]:
    """(generated text, finish_reason, completion tokens) of a JSON or SSE answer."""
    key = "text" if api == COMPLETIONS else "content"
    if not stream:
        obj = orjson.loads(raw)
        ch = obj["choices"][0]
        txt = ch["text"] if api == COMPLETIONS else ch["message"]["content"]
        return txt, ch["finish_reason"], obj["usage"]["completion_tokens"]
    out, finish = [], None
    for line in raw.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        for ch in ev.get("choices", ()):
            part = ch.get("text") if api == COMPLETIONS else (ch.get("delta") or {}).get(key)
            out.append(part or "")
            finish = ch.get("finish_reason") or finish
    assert raw.decode().rstrip().endswith("data: [DONE]")
    return "".join(out), finish, None


BODIES = [
    (COMPLETIONS, "/v1/completions", {"model": MODEL, "prompt": "The quick brown fox jumps", "max_tokens": 12}),
    (CHAT, "/v1/chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": "Tell me about foxes"}], "max_tokens": 10}),
]


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as st:
        yield st


async def coordinator(st: AsyncExitStack, tmp: Path, config: dict[str, Any] | None = None) -> Stubs:
    c = await st.enter_async_context(start_coordinator(tmp, config or FAST, management_key=KEY))
    stubs = Stubs(c.address)
    st.push_async_callback(stubs.close)
    return stubs


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_pd_answers_equal_a_union_engines_answer_stream_and_not(
    engine: str, tmp_path: Path, stack: AsyncExitStack
) -> None:
    etype = EngineType.VLLM if engine == "vllm" else EngineType.SGLANG
    p, d, u = await asyncio.gather(*(stack.enter_async_context(start_simulator(engine, r, tmp_path))
                                     for r in ("prefill", "decode", "union")))
    s = await coordinator(stack, tmp_path)
    # UNAUTHENTICATED without the key, on the real process
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await s.registry.SetInstances(cpb.SetInstancesRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    await s.set(instance(1, Role.PREFILL, etype, [p]), instance(2, Role.DECODE, etype, [d]))
    await wait_for(lambda: _ready(s), timeout=10, what="coordinator ready")
    for api, path, body in BODIES:
        for stream in (False, True):
            b = {**body, "stream": stream}
            head, raw = await dispatch(s, api, b)
            assert head.http_status == 200, raw
            assert (head.prefill_instance_id, head.decode_instance_id) == (1, 2)
            assert head.content_type.startswith("text/event-stream" if stream else "application/json")
            want = await asyncio.to_thread(direct, u, path, b)
            assert text_of(api, raw, stream) == text_of(api, want, stream)
    # the KV really moved from P to D (no local recompute on D)
    ps, ds = await asyncio.to_thread(sim_state, p), await asyncio.to_thread(sim_state, d)
    assert ps["stats"]["kv_transfers"] == 4 and ds["stats"]["kv_transfer_fallbacks"] == 0


async def _ready(s: Stubs) -> bool:
    return bool((await s.readiness()).ready)


def _served_alone(c: Proc) -> list[str]:
    """The coordinator's motor_coordinator_model_served_alone samples."""
    with urllib.request.urlopen(f"http://127.0.0.1:{c.ports['metrics']}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return [line for line in text.splitlines() if line.startswith("motor_coordinator_model_served_alone{")]


async def test_errors_before_the_head_and_engine_4xx_relayed(tmp_path: Path, stack: AsyncExitStack) -> None:
    u = await stack.enter_async_context(start_simulator("vllm", "union", tmp_path))
    s = await coordinator(stack, tmp_path)

    async def code_of(api: int, raw: bytes) -> tuple[grpc.StatusCode, str | None, str]:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in s.dispatch.Dispatch(cpb.DispatchRequest(api=api, body=raw), timeout=10):
                pass
        return err.value.code(), error_reason(err.value), err.value.details() or ""

    # no instance set received yet (a restart, a first sync): retryable UNAVAILABLE, never NOT_FOUND
    code, reason, msg = await code_of(COMPLETIONS, orjson.dumps({"model": MODEL, "prompt": "x"}))
    assert code == grpc.StatusCode.UNAVAILABLE and reason == "REGISTRY_NOT_SYNCED", msg
    await s.set(instance(3, Role.UNION, EngineType.VLLM, [u]))
    # NOT_FOUND only for a model the authoritative set does not contain
    code, reason, msg = await code_of(COMPLETIONS, orjson.dumps({"model": "no-such-model", "prompt": "x"}))
    assert code == grpc.StatusCode.NOT_FOUND and reason == "MODEL_NOT_FOUND"
    assert (await code_of(COMPLETIONS, b"{nope"))[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert (await code_of(COMPLETIONS, b'{"prompt": "x"}'))[1] == "MISSING_MODEL"
    assert (await code_of(cpb.OPEN_AI_API_UNSPECIFIED, b"{}"))[0] == grpc.StatusCode.INVALID_ARGUMENT
    # a request id that would inject a header line into the engine request (or a log line)
    for rid in ("a\r\nX-Evil: 1", "tab\there", "caf\u00e9"):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in s.dispatch.Dispatch(cpb.DispatchRequest(
                    request_id=rid, api=COMPLETIONS, body=orjson.dumps({"model": MODEL, "prompt": "x"})), timeout=10):
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and error_reason(err.value) == "INVALID_REQUEST_ID"
        assert "printable ASCII" in (err.value.details() or "")
    # a chat content part whose text is not a string is the engine's to judge (the simulator
    # takes it, vLLM answers 400), not an INTERNAL error of the coordinator's routing
    head, raw = await dispatch(s, CHAT, {"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "text", "text": None}]}]})
    assert head.http_status == 200 and b'"chat.completion"' in raw, raw
    head, raw = await dispatch(s, COMPLETIONS, {"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert head.http_status == 200 and head.prefill_instance_id == head.decode_instance_id == 3
    # the engine's own 4xx comes back as head + body, unchanged
    head, raw = await dispatch(s, COMPLETIONS, {"model": MODEL, "prompt": "hi", "max_tokens": 2,
                                                "stream": False, "stream_options": {"include_usage": True}})
    assert head.http_status == 400 and b"Stream options" in raw, raw
    await s.registry.PauseInstances(cpb.PauseInstancesRequest(instance_ids=[3]), metadata=MD, timeout=5)
    code, reason, msg = await code_of(COMPLETIONS, orjson.dumps({"model": MODEL, "prompt": "x"}))
    assert code == grpc.StatusCode.UNAVAILABLE and "union" in msg
    # a vLLM prefill alone answers whole (scheduler.prefill_only_fallback; refusals below)
    await s.set(instance(4, Role.PREFILL, EngineType.VLLM, [u]))
    head, raw = await dispatch(s, COMPLETIONS, {"model": MODEL, "prompt": "x", "max_tokens": 2})
    assert head.http_status == 200 and head.prefill_instance_id == head.decode_instance_id == 4, raw


async def test_with_no_prefill_schedulable_a_vllm_decode_serves_requests_whole_until_a_prefill_is_back(
    tmp_path: Path, stack: AsyncExitStack
) -> None:
    """The only prefill paused (down, breaker open, all alike): the coordinator stays ready and
    sends each request whole to the decode, which computes the prompt itself — the same text as
    a union engine's, stream and not; the decode is retried like a union. A prefill back: P/D again."""
    p, d, u = await asyncio.gather(*(stack.enter_async_context(start_simulator("vllm", r, tmp_path))
                                     for r in ("prefill", "decode", "union")))
    s = await coordinator(stack, tmp_path)
    await s.set(instance(1, Role.PREFILL, EngineType.VLLM, [p]), instance(2, Role.DECODE, EngineType.VLLM, [d]))
    await wait_for(lambda: _ready(s), timeout=10, what="coordinator ready")
    await s.registry.PauseInstances(cpb.PauseInstancesRequest(instance_ids=[1]), metadata=MD, timeout=5)
    r = await s.readiness()
    assert r.ready and r.reason == "", r.reason
    assert [(a.model, a.role) for a in r.served_alone] == [(MODEL, tpb.ROLE_DECODE)]
    before = (await asyncio.to_thread(sim_state, d))["stats"]
    for api, path, body in BODIES:
        for stream in (False, True):
            b = {**body, "stream": stream}
            head, raw = await dispatch(s, api, b)
            assert head.http_status == 200, raw
            assert (head.prefill_instance_id, head.decode_instance_id) == (2, 2)
            want = await asyncio.to_thread(direct, u, path, b)
            assert text_of(api, raw, stream) == text_of(api, want, stream)
    after = (await asyncio.to_thread(sim_state, d))["stats"]
    assert after["prompt_tokens_external_kv_transfer"] == before["prompt_tokens_external_kv_transfer"]
    assert after["prompt_tokens_local_compute"] > before["prompt_tokens_local_compute"]
    assert (await asyncio.to_thread(sim_state, p))["stats"]["kv_transfers"] == 0
    await s.registry.ResumeInstances(cpb.ResumeInstancesRequest(instance_ids=[1]), metadata=MD, timeout=5)
    head, raw = await dispatch(s, COMPLETIONS, BODIES[0][2])
    assert head.http_status == 200 and (head.prefill_instance_id, head.decode_instance_id) == (1, 2)
    assert (await asyncio.to_thread(sim_state, p))["stats"]["kv_transfers"] == 1


@pytest.mark.parametrize("fallback", [True, False])
async def test_a_request_whose_prefills_are_all_unreachable_is_computed_whole_by_the_vllm_decode(
    fallback: bool, tmp_path: Path, stack: AsyncExitStack
) -> None:
    """The prefill is registered and schedulable (its breaker still closed) but nothing listens on
    its port: the request is not refused PREFILL_FAILED, the decode computes it whole — unless
    ``scheduler.decode_only_fallback`` is off."""
    d, u = await asyncio.gather(*(stack.enter_async_context(start_simulator("vllm", r, tmp_path))
                                  for r in ("decode", "union")))
    config = {**FAST, "scheduler": {"decode_only_fallback": fallback},
              "dispatch": {**FAST["dispatch"], "health_probe_interval_sec": 60}}  # the breaker stays closed
    s = await coordinator(stack, tmp_path, config)
    gone = Instance(1, Role.PREFILL, "job-1", MODEL, EngineType.VLLM, (Endpoint(0, "127.0.0.1", free_port()),),
                    InstanceStatus.AVAILABLE)
    await s.set(gone, instance(2, Role.DECODE, EngineType.VLLM, [d]))
    await wait_for(lambda: _ready(s), timeout=10, what="coordinator ready")
    api, path, body = BODIES[0]
    if not fallback:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await dispatch(s, api, body)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and error_reason(err.value) == "PREFILL_FAILED"
        return
    head, raw = await dispatch(s, api, body)
    assert head.http_status == 200 and (head.prefill_instance_id, head.decode_instance_id) == (2, 2), raw
    assert text_of(api, raw, False) == text_of(api, await asyncio.to_thread(direct, u, path, body), False)


@pytest.mark.parametrize("case", ["sglang", "fallback off"])
async def test_with_no_prefill_schedulable_sglang_or_a_fleet_without_the_fallback_refuses_naming_the_prefill(
    case: str, tmp_path: Path, stack: AsyncExitStack
) -> None:
    """SGLang decodes wait for a prefill's KV, so they cannot serve alone; with
    ``scheduler.decode_only_fallback: false`` vLLM's do not either: UNAVAILABLE, not ready."""
    engine, etype = ("sglang", EngineType.SGLANG) if case == "sglang" else ("vllm", EngineType.VLLM)
    p, d = await asyncio.gather(*(stack.enter_async_context(start_simulator(engine, r, tmp_path))
                                  for r in ("prefill", "decode")))
    config = FAST if case == "sglang" else {**FAST, "scheduler": {"decode_only_fallback": False}}
    s = await coordinator(stack, tmp_path, config)
    await s.set(instance(1, Role.PREFILL, etype, [p]), instance(2, Role.DECODE, etype, [d]))
    await wait_for(lambda: _ready(s), timeout=10, what="coordinator ready")
    await s.registry.PauseInstances(cpb.PauseInstancesRequest(instance_ids=[1]), metadata=MD, timeout=5)
    r = await s.readiness()
    assert not r.ready and r.reason == "no schedulable prefill+decode pair or union instance"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await dispatch(s, COMPLETIONS, BODIES[0][2])
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_with_no_decode_schedulable_a_vllm_prefill_serves_requests_whole_until_a_decode_is_back(
    tmp_path: Path, stack: AsyncExitStack
) -> None:
    """The only decode paused (down, breaker open, all alike): the coordinator stays ready and
    sends each request whole to the prefill, which decodes too — the same text as a union
    engine's, stream and not; no KV pinned for a decode that will not come. A decode back: P/D again."""
    p, d, u = await asyncio.gather(*(stack.enter_async_context(start_simulator("vllm", r, tmp_path))
                                     for r in ("prefill", "decode", "union")))
    c = await stack.enter_async_context(start_coordinator(tmp_path, {**FAST, "server": {"metrics_port": 0}},
                                                          management_key=KEY))
    s = Stubs(c.address)
    stack.push_async_callback(s.close)
    await s.set(instance(1, Role.PREFILL, EngineType.VLLM, [p]), instance(2, Role.DECODE, EngineType.VLLM, [d]))
    await wait_for(lambda: _ready(s), timeout=10, what="coordinator ready")
    assert list((await s.readiness()).served_alone) == []
    assert _served_alone(c) == []
    await s.registry.PauseInstances(cpb.PauseInstancesRequest(instance_ids=[2]), metadata=MD, timeout=5)
    r = await s.readiness()
    assert r.ready and r.reason == "", r.reason
    # degraded, and said so: GetReadiness and the coordinator's metric
    assert [(a.model, a.role) for a in r.served_alone] == [(MODEL, tpb.ROLE_PREFILL)]
    assert _served_alone(c) == [f'motor_coordinator_model_served_alone{{model="{MODEL}",role="prefill"}} 1.0']
    d_before = (await asyncio.to_thread(sim_state, d))["stats"]["requests_finished"]
    p_before = (await asyncio.to_thread(sim_state, p))["stats"]
    for api, path, body in BODIES:
        for stream in (False, True):
            b = {**body, "stream": stream}
            head, raw = await dispatch(s, api, b)
            assert head.http_status == 200, raw
            assert (head.prefill_instance_id, head.decode_instance_id) == (1, 1)
            want = await asyncio.to_thread(direct, u, path, b)
            assert text_of(api, raw, stream) == text_of(api, want, stream)
    p_after = (await asyncio.to_thread(sim_state, p))["stats"]
    assert p_after["requests_finished"] - p_before["requests_finished"] == 4
    assert p_after["generation_tokens"] - p_before["generation_tokens"] > 4  # whole answers, not 1 token each
    assert (await asyncio.to_thread(sim_state, d))["stats"]["requests_finished"] == d_before
    assert (await asyncio.to_thread(sim_state, p))["kv"]["leases"] == 0  # no KV pinned for a decode
    await s.registry.ResumeInstances(cpb.ResumeInstancesRequest(instance_ids=[2]), metadata=MD, timeout=5)
    assert list((await s.readiness()).served_alone) == [] and _served_alone(c) == []
    head, raw = await dispatch(s, COMPLETIONS, BODIES[0][2])
    assert head.http_status == 200 and (head.prefill_instance_id, head.decode_instance_id) == (1, 2)
    assert (await asyncio.to_thread(sim_state, p))["stats"]["kv_transfers"] == 1


@pytest.mark.parametrize("fallback", [True, False])
async def test_a_request_whose_decodes_are_all_unreachable_is_computed_whole_by_its_vllm_prefill(
    fallback: bool, tmp_path: Path, stack: AsyncExitStack
) -> None:
    """The decode is registered and schedulable (its breaker still closed) but nothing listens on
    its port: after the prefill answered, the request is not refused DECODE_FAILED, the prefill
    computes it whole — unless ``scheduler.prefill_only_fallback`` is off."""
    p, u = await asyncio.gather(*(stack.enter_async_context(start_simulator("vllm", r, tmp_path))
                                  for r in ("prefill", "union")))
    config = {**FAST, "scheduler": {"prefill_only_fallback": fallback},
              "dispatch": {**FAST["dispatch"], "health_probe_interval_sec": 60}}  # the breaker stays closed
    s = await coordinator(stack, tmp_path, config)
    gone = Instance(2, Role.DECODE, "job-2", MODEL, EngineType.VLLM, (Endpoint(0, "127.0.0.1", free_port()),),
                    InstanceStatus.AVAILABLE)
    await s.set(instance(1, Role.PREFILL, EngineType.VLLM, [p]), gone)
    await wait_for(lambda: _ready(s), timeout=10, what="coordinator ready")
    for api, path, body in BODIES:
        for stream in (False, True):
            b = {**body, "stream": stream}
            if not fallback:  # (the first failures open the decode's breaker: then NO_SCHEDULABLE_INSTANCE)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await dispatch(s, api, b)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE and error_reason(err.value) == "DECODE_FAILED"
                return
            head, raw = await dispatch(s, api, b)
            assert head.http_status == 200 and (head.prefill_instance_id, head.decode_instance_id) == (1, 1), raw
            want = await asyncio.to_thread(direct, u, path, b)
            assert text_of(api, raw, stream) == text_of(api, want, stream)


@pytest.mark.parametrize("case", ["sglang", "fallback off"])
async def test_with_no_decode_schedulable_sglang_or_a_fleet_without_the_fallback_refuses_naming_the_decode(
    case: str, tmp_path: Path, stack: AsyncExitStack
) -> None:
    """SGLang prefills hand their KV to a decode, so they cannot serve alone; with
    ``scheduler.prefill_only_fallback: false`` vLLM's do not either: UNAVAILABLE, not ready."""
    engine, etype = ("sglang", EngineType.SGLANG) if case == "sglang" else ("vllm", EngineType.VLLM)
    p, d = await asyncio.gather(*(stack.enter_async_context(start_simulator(engine, r, tmp_path))
                                  for r in ("prefill", "decode")))
    config = FAST if case == "sglang" else {**FAST, "scheduler": {"prefill_only_fallback": False}}
    s = await coordinator(stack, tmp_path, config)
    await s.set(instance(1, Role.PREFILL, etype, [p]), instance(2, Role.DECODE, etype, [d]))
    await wait_for(lambda: _ready(s), timeout=10, what="coordinator ready")
    await s.registry.PauseInstances(cpb.PauseInstancesRequest(instance_ids=[2]), metadata=MD, timeout=5)
    r = await s.readiness()
    assert not r.ready and r.reason == "no schedulable prefill+decode pair or union instance"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await dispatch(s, COMPLETIONS, BODIES[0][2])
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and error_reason(err.value) == "NO_SCHEDULABLE_INSTANCE"
    assert "no schedulable decode instance" in (err.value.details() or "")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_client_cancellation_aborts_the_engine_requests(
    engine: str, tmp_path: Path, stack: AsyncExitStack
) -> None:
    etype = EngineType.VLLM if engine == "vllm" else EngineType.SGLANG
    p, d = await asyncio.gather(*(stack.enter_async_context(start_simulator(engine, r, tmp_path))
                                  for r in ("prefill", "decode")))
    s = await coordinator(stack, tmp_path)
    await s.set(instance(1, Role.PREFILL, etype, [p]), instance(2, Role.DECODE, etype, [d]))
    body = {"model": MODEL, "prompt": "tell a very long story", "max_tokens": 4000, "stream": True}
    call = s.dispatch.Dispatch(cpb.DispatchRequest(api=COMPLETIONS, body=orjson.dumps(body)), timeout=60)
    frames = 0
    async for _ in call:
        frames += 1
        if frames >= 4:
            break
    assert (await asyncio.to_thread(sim_state, d))["running"] == 1
    call.cancel()

    def decode_aborted() -> bool:
        st = sim_state(d)
        return bool(st["running"] == 0 and st["stats"]["requests_aborted"] >= 1)

    await wait_for(lambda: asyncio.to_thread(decode_aborted), timeout=10, what="decode engine aborted")
    await wait_for(lambda: asyncio.to_thread(lambda: sim_state(p)["running"] == 0), timeout=10, what="prefill idle")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_killed_prefill_fails_in_flight_cleanly_and_new_requests_use_the_survivor(
    engine: str, tmp_path: Path, stack: AsyncExitStack
) -> None:
    etype = EngineType.VLLM if engine == "vllm" else EngineType.SGLANG
    slow = ["--sim-prefill-base-ms", "150"]
    p1, p2, d = await asyncio.gather(
        stack.enter_async_context(start_simulator(engine, "prefill", tmp_path, extra_args=slow, name="p1")),
        stack.enter_async_context(start_simulator(engine, "prefill", tmp_path, extra_args=slow, name="p2")),
        stack.enter_async_context(start_simulator(engine, "decode", tmp_path, name="d")),
    )
    s = await coordinator(stack, tmp_path, {**FAST, "scheduler": {"policy": "round_robin"}})
    await s.set(instance(1, Role.PREFILL, etype, [p1]), instance(2, Role.PREFILL, etype, [p2]),
                instance(3, Role.DECODE, etype, [d]))
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 4}

    async def one(i: int) -> str:
        try:
            head, _ = await dispatch(s, COMPLETIONS, {**body, "prompt": f"hello {i}"}, timeout=20)
            return f"http {head.http_status}"
        except grpc.aio.AioRpcError as exc:
            return exc.code().name

    tasks = [asyncio.create_task(one(i)) for i in range(12)]
    await wait_for(lambda: asyncio.to_thread(lambda: sim_state(p1)["running"] + sim_state(p1)["waiting"] > 0),
                   timeout=10, what="load on p1")
    p1.kill()
    results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)  # nothing hangs
    # in-flight prefills on p1 are retried on p2 or fail with a clean status; a decode whose KV
    # lived on p1 may answer with the engine's own 5xx
    assert set(results) <= {"http 200", "http 500", "UNAVAILABLE"}, results
    assert results.count("http 200") >= 6, results
    for i in range(6):  # afterwards everything goes to the survivor
        head, _ = await dispatch(s, COMPLETIONS, {**body, "prompt": f"after {i}"}, timeout=20)
        assert head.http_status == 200 and head.prefill_instance_id == 2

    async def p1_unavailable() -> bool:
        resp = await s.list()
        return any(i.id == 1 and i.status == tpb.INSTANCE_STATUS_UNAVAILABLE for i in resp.instances)

    await wait_for(p1_unavailable, timeout=10, what="p1 shown UNAVAILABLE")
    assert (await s.readiness()).ready


async def test_request_timeout_ends_the_call_with_deadline_exceeded(tmp_path: Path, stack: AsyncExitStack) -> None:
    u = await stack.enter_async_context(start_simulator("vllm", "union", tmp_path))
    s = await coordinator(stack, tmp_path, {"dispatch": {"request_timeout_sec": 0.5}})
    await s.set(instance(3, Role.UNION, EngineType.VLLM, [u]))
    body = {"model": MODEL, "prompt": "long", "max_tokens": 4000, "stream": True}
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await dispatch(s, COMPLETIONS, body)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await wait_for(lambda: asyncio.to_thread(lambda: sim_state(u)["running"] == 0), timeout=10, what="engine idle")
