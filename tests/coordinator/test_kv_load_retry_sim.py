"""A vLLM decode that cannot load the prefill's KV (vLLM's default ``kv_load_failure_policy:
fail``: 500, or a streamed error event) gets the hand-off run again: a fresh prefill, another decode
when there is one — so the client sees the same answer as from a union engine.

Real ``motor-sim`` engines with the ``kv_load_fail`` fault (the decode's next KV loads fail as a
timed-out NIXL handshake does on real vLLM), dispatched through an in-process coordinator's gRPC API.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest

from motor_common.domain import Endpoint, EngineType, Instance, InstanceStatus, Role
from motor_common.grpc_server import error_reason
from tests.coordinator.test_decode_retry_sim import coordinator, nothing_in_flight
from tests.coordinator.test_dispatch_sim import (
    CHAT,
    COMPLETIONS,
    MODEL,
    dispatch,
    instance,
    sim_state,
    text_of,
)
from tests.helpers import free_port
from tests.procs import Proc, start_simulator

pytestmark = pytest.mark.slow

VLLM = EngineType.VLLM
SHAPES = [
    (COMPLETIONS, "/v1/completions", {"model": MODEL, "prompt": "Handshakes time out under load", "max_tokens": 7}),
    (CHAT, "/v1/chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": "Retry the hand-off"}], "max_tokens": 6}),
]
ERROR_EVENT = (b'data: {"error": {"message": "Internal server error", "type": "InternalServerError", '
               b'"param": null, "code": 500}}')


def set_fault(sim: Proc, **fault: Any) -> None:
    req = urllib.request.Request(sim.url + "/sim/fault", data=orjson.dumps(fault),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200


def union_text(u: Proc, path: str, body: dict[str, Any]) -> str:
    req = urllib.request.Request(u.url + path, data=orjson.dumps(body), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        obj = json.loads(resp.read())
    ch = obj["choices"][0]
    return str(ch["text"] if path == "/v1/completions" else ch["message"]["content"])


async def sims(tmp: Path, st: AsyncExitStack, *roles: str) -> list[Proc]:
    return list(await asyncio.gather(*(st.enter_async_context(start_simulator("vllm", r, tmp, name=f"{r}-{i}"))
                                       for i, r in enumerate(roles))))


async def test_a_failed_kv_load_is_retried_and_the_client_gets_the_union_answer(tmp_path: Path) -> None:
    async with AsyncExitStack() as st:
        p, d, u = await sims(tmp_path, st, "prefill", "decode", "union")
        app, s = await st.enter_async_context(coordinator())
        ip, idd = instance(1, Role.PREFILL, VLLM, [p]), instance(2, Role.DECODE, VLLM, [d])
        await s.set(ip, idd)
        n = 0
        for api, path, body in SHAPES:
            want = await asyncio.to_thread(union_text, u, path, body)
            for stream in (False, True):
                set_fault(d, mode="kv_load_fail", count=1)  # the next KV load fails, then it works
                head, raw = await dispatch(s, api, dict(body, stream=stream))
                n += 1
                assert head.http_status == 200 and head.decode_instance_id == 2
                assert ERROR_EVENT not in raw
                assert text_of(api, raw, stream)[0] == want
        ds, ps = await asyncio.to_thread(sim_state, d), await asyncio.to_thread(sim_state, p)
        assert ds["stats"]["kv_load_failures"] == n and ds["stats"]["requests_finished"] == n
        assert ps["stats"]["requests_finished"] == 2 * n  # every request was prefilled twice
        assert ps["stats"]["kv_transfers"] == n and ds["stats"]["kv_transfer_fallbacks"] == 0
        await nothing_in_flight(app, ip, idd)


async def test_the_retry_goes_to_another_decode_when_there_is_one(tmp_path: Path) -> None:
    async with AsyncExitStack() as st:
        p, bad, good = await sims(tmp_path, st, "prefill", "decode", "decode")
        app, s = await st.enter_async_context(coordinator())
        ip = instance(1, Role.PREFILL, VLLM, [p])
        ibad, igood = instance(2, Role.DECODE, VLLM, [bad]), instance(3, Role.DECODE, VLLM, [good])
        await s.set(ip, ibad, igood)
        set_fault(bad, mode="kv_load_fail")  # every load fails on this decode
        for i in range(6):
            api, _, body = SHAPES[i % 2]
            head, raw = await dispatch(s, api, dict(body, stream=i % 3 == 0))
            assert head.http_status == 200 and head.decode_instance_id == 3, raw[:300]
        bs, gs = await asyncio.to_thread(sim_state, bad), await asyncio.to_thread(sim_state, good)
        assert bs["stats"]["kv_load_failures"] >= 1 and bs["stats"]["requests_finished"] == 0
        assert gs["stats"]["requests_finished"] == 6
        await nothing_in_flight(app, ip, ibad, igood)


async def test_a_hand_off_retry_that_finds_no_reachable_prefill_has_the_decode_compute_it_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The prefill that answered is gone when the hand-off is run again (the only prefill died
    after its first answer; here: the other prefill is a port nobody listens on and
    ``prefill_retries`` is 0): the request is not refused PREFILL_FAILED, the decode computes it
    whole (``scheduler.decode_only_fallback``) — the union engine's text."""
    async with AsyncExitStack() as st:
        p, d, u = await sims(tmp_path, st, "prefill", "decode", "union")
        app, s = await st.enter_async_context(coordinator(prefill_retries=0, kv_load_retries=1))
        gone = Instance(3, Role.PREFILL, "job-3", MODEL, VLLM, (Endpoint(0, "127.0.0.1", free_port()),),
                        InstanceStatus.AVAILABLE)
        ip, idd = instance(1, Role.PREFILL, VLLM, [p]), instance(2, Role.DECODE, VLLM, [d])
        await s.set(ip, idd, gone)
        api, path, body = SHAPES[0]
        want = await asyncio.to_thread(union_text, u, path, body)
        for stream in (False, True, False, True):  # round robin: each prefill first in turn
            set_fault(d, mode="kv_load_fail", count=1)
            head, raw = await dispatch(s, api, dict(body, stream=stream))
            assert head.http_status == 200 and head.decode_instance_id == 2, raw[:300]
            assert ERROR_EVENT not in raw and text_of(api, raw, stream)[0] == want
        ds = await asyncio.to_thread(sim_state, d)
        assert ds["stats"]["kv_load_failures"] >= 1  # the hand-off retry path was taken
        assert any("hand-off retry: prefill unreachable" in r.getMessage() and "computes it whole" in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records][-10:]
        await nothing_in_flight(app, ip, idd)


async def test_retries_exhausted_end_the_call_with_a_public_kv_transfer_error(tmp_path: Path) -> None:
    """The decode's own error (vLLM: an ``InternalServerError`` object, or that object as an SSE
    event in a 200 stream) is the engine's internals: the client gets UNAVAILABLE
    ``KV_TRANSFER_FAILED`` naming the request id, the log has the engine's answer."""
    async with AsyncExitStack() as st:
        p, d = await sims(tmp_path, st, "prefill", "decode")
        app, s = await st.enter_async_context(coordinator(kv_load_retries=1))
        ip, idd = instance(1, Role.PREFILL, VLLM, [p]), instance(2, Role.DECODE, VLLM, [d])
        await s.set(ip, idd)
        set_fault(d, mode="kv_load_fail")
        api, _, body = SHAPES[0]
        for stream in (False, True):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await dispatch(s, api, dict(body, stream=stream))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert error_reason(err.value) == "KV_TRANSFER_FAILED"
            details = err.value.details() or ""
            assert "could not load the prefill's KV cache (2 attempt(s))" in details and "request id" in details
            assert "InternalServerError" not in details and str(d.port) not in details and str(p.port) not in details
        ds = await asyncio.to_thread(sim_state, d)
        assert ds["stats"]["kv_load_failures"] == 4  # 2 requests x (1 + kv_load_retries)
        await nothing_in_flight(app, ip, idd)


async def test_kv_load_retries_0_ends_the_call_at_the_first_failure(tmp_path: Path) -> None:
    async with AsyncExitStack() as st:
        p, d = await sims(tmp_path, st, "prefill", "decode")
        app, s = await st.enter_async_context(coordinator(kv_load_retries=0))
        ip, idd = instance(1, Role.PREFILL, VLLM, [p]), instance(2, Role.DECODE, VLLM, [d])
        await s.set(ip, idd)
        set_fault(d, mode="kv_load_fail", count=1)
        api, _, body = SHAPES[1]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await dispatch(s, api, dict(body, stream=True))
        assert error_reason(err.value) == "KV_TRANSFER_FAILED" and "(1 attempt(s))" in (err.value.details() or "")
        head, raw = await dispatch(s, api, body)  # the fault is used up: served normally
        assert head.http_status == 200 and text_of(api, raw, False)[1] == "length"
        await nothing_in_flight(app, ip, idd)
