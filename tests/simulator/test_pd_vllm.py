"""vLLM NIXL-style PD hand-off between two real simulator processes."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest

from .conftest import SimFactory, SimProc

PROMPT = "Disaggregated serving splits prefill and decode across engines"
TIMEOUT = aiohttp.ClientTimeout(total=10)


async def post(sim: SimProc, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], Any]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s, s.post(sim.v1 + path, json=body) as r:
        return r.status, dict(r.headers), await r.json()


async def state(sim: SimProc) -> dict[str, Any]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s, s.get(sim.url + "/sim/state") as r:
        data: dict[str, Any] = await r.json()
        return data


async def prefill(p: SimProc, body: dict[str, Any]) -> dict[str, Any]:
    pbody = dict(body, max_tokens=1, stream=False, kv_transfer_params={
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
        "remote_block_ids": None, "remote_host": None, "remote_port": None})
    status, _, resp = await post(p, "/completions", pbody)
    assert status == 200, resp
    ktp: dict[str, Any] = resp["kv_transfer_params"]
    return ktp


@pytest.mark.slow
async def test_prefill_then_decode_equals_union_and_frees_producer_blocks(sims: SimFactory) -> None:
    p = sims.vllm(role="kv_producer")
    d = sims.vllm(role="kv_consumer")
    u = sims.vllm()
    body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 12, "seed": 5}
    ktp = await prefill(p, body)
    # exactly the fields vLLM 0.32's NixlConnector (pull mode) returns from a producer
    assert set(ktp) == {"do_remote_prefill", "do_remote_decode", "remote_engine_id",
                        "remote_request_id", "remote_block_ids", "remote_host", "remote_port",
                        "tp_size", "dcp_size", "pp_size", "remote_num_tokens",
                        "remote_blocks_expiry_time", "transfer_mode", "remote_prefill_cached_tokens"}
    assert ktp["do_remote_prefill"] is True and ktp["do_remote_decode"] is False
    assert ktp["remote_port"] == p.ports["side_channel"]
    [group] = ktp["remote_block_ids"]  # block ids per KV cache group, one group
    assert group and all(isinstance(b, int) for b in group)
    assert ktp["transfer_mode"] == "pull" and ktp["remote_blocks_expiry_time"] is None
    assert (ktp["tp_size"], ktp["dcp_size"], ktp["pp_size"]) == (1, 1, 1)
    assert (await state(p))["kv"]["leases"] == 1 and (await state(p))["kv"]["used"] > 0

    status, headers, dresp = await post(d, "/completions", dict(body, kv_transfer_params=ktp))
    _, _, uresp = await post(u, "/completions", body)
    assert status == 200 and "x-motor-sim-kv-fallback" not in headers
    assert dresp["choices"][0]["text"] == uresp["choices"][0]["text"]
    assert dresp["usage"] == uresp["usage"]
    assert ktp["remote_num_tokens"] == uresp["usage"]["prompt_tokens"]
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s, s.get(d.url + "/metrics") as r:
        dm = await r.text()
    n = uresp["usage"]["prompt_tokens"]
    assert ('vllm:prompt_tokens_by_source_total{engine="0",model_name="sim-model",'
            f'source="external_kv_transfer"}} {float(n)}') in dm, dm
    assert ('vllm:prompt_tokens_by_source_total{engine="0",model_name="sim-model",'
            'source="local_compute"} 0.0') in dm
    ps = await state(p)
    assert ps["kv"]["leases"] == 0 and ps["kv"]["used"] == 0 and ps["stats"]["kv_transfers"] == 1
    assert (await state(d))["stats"]["kv_transfer_fallbacks"] == 0


@pytest.mark.slow
async def test_pd_chat_streaming_equals_union(sims: SimFactory) -> None:
    p = sims.vllm(role="kv_both")
    d = sims.vllm(role="kv_both")
    u = sims.vllm()
    body = {"model": "sim-model", "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 7}
    status, _, presp = await post(p, "/chat/completions", dict(body, max_tokens=1,
                                  kv_transfer_params={"do_remote_decode": True}))
    assert status == 200
    ktp = presp["kv_transfer_params"]
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        async with s.post(d.v1 + "/chat/completions",
                          json=dict(body, stream=True, kv_transfer_params=ktp)) as r:
            raw = (await r.read()).decode()
    _, _, uresp = await post(u, "/chat/completions", body)
    text = "".join(
        json.loads(e[6:])["choices"][0]["delta"].get("content", "")
        for e in raw.split("\n\n") if e.startswith("data: {") and json.loads(e[6:])["choices"])
    assert text == uresp["choices"][0]["message"]["content"]


INTERNAL = {"error": {"message": "Internal server error", "type": "InternalServerError",
                      "param": None, "code": 500}}


async def metric(sim: SimProc, line_start: str) -> str:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s, s.get(sim.url + "/metrics") as r:
        text = await r.text()
    return next((ln for ln in text.splitlines() if ln.startswith(line_start)), "")


@pytest.mark.slow
async def test_failed_kv_load_answers_500_under_vllms_default_policy_fail(sims: SimFactory) -> None:
    p = sims.vllm(role="kv_producer")
    d = sims.vllm(role="kv_consumer")  # no kv_load_failure_policy: vLLM's default "fail"
    body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 5}
    ktp = await prefill(p, body)
    forged = dict(ktp, remote_engine_id="not-the-engine")
    status, headers, resp = await post(d, "/completions", dict(body, kv_transfer_params=forged))
    assert status == 500 and resp == INTERNAL and "x-motor-sim-kv-fallback" not in headers
    flat = dict(ktp, remote_block_ids=ktp["remote_block_ids"][0])  # pre-0.32 flat ids: refused
    status, _, resp = await post(d, "/completions", dict(body, kv_transfer_params=flat))
    assert status == 500 and resp == INTERNAL
    missing = {"do_remote_prefill": True, "do_remote_decode": False}
    status, _, _ = await post(d, "/completions", dict(body, kv_transfer_params=missing))
    assert status == 500
    # a failed load does not consume the lease: the genuine params still work afterwards
    status, headers, good = await post(d, "/completions", dict(body, kv_transfer_params=ktp))
    assert status == 200 and good["choices"][0]["finish_reason"] == "length"
    ds = await state(d)
    assert ds["stats"]["kv_load_failures"] == 3 and ds["stats"]["kv_transfer_fallbacks"] == 0
    assert (await metric(d, "motor_sim:kv_load_failures_total")).endswith(" 3.0")
    assert "failing the request (kv_load_failure_policy=fail)" in d.log()


@pytest.mark.slow
async def test_failed_kv_load_streams_vllms_error_event(sims: SimFactory) -> None:
    """Streamed, vLLM has sent its 200 headers: the error is an event (after chat's role chunk)."""
    d = sims.vllm(role="kv_consumer", policy="fail")
    bad = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "x",
           "remote_request_id": "r", "remote_block_ids": [[1]], "remote_host": "127.0.0.1",
           "remote_port": 1}
    error_event = 'data: {"error": {"message": "Internal server error", "type": "InternalServerError", ' \
                  '"param": null, "code": 500}}'
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        async with s.post(d.v1 + "/completions", json={"prompt": PROMPT, "max_tokens": 4, "stream": True,
                                                      "kv_transfer_params": bad}) as r:
            assert r.status == 200 and r.content_type == "text/event-stream"
            events = [e for e in (await r.read()).decode().split("\n\n") if e]
        assert events == [error_event, "data: [DONE]"]
        async with s.post(d.v1 + "/chat/completions", json={
                "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4, "stream": True,
                "kv_transfer_params": bad}) as r:
            assert r.status == 200
            events = [e for e in (await r.read()).decode().split("\n\n") if e]
    assert len(events) == 3 and events[1:] == [error_event, "data: [DONE]"]
    role = json.loads(events[0][6:])
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}


@pytest.mark.slow
async def test_failed_kv_load_recomputes_under_policy_recompute_and_says_so(sims: SimFactory) -> None:
    p = sims.vllm(role="kv_producer")
    d = sims.vllm(role="kv_consumer", policy="recompute")
    body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 5}
    ktp = await prefill(p, body)
    forged = dict(ktp, remote_engine_id="not-the-engine")
    status, headers, forged_resp = await post(d, "/completions", dict(body, kv_transfer_params=forged))
    assert status == 200 and headers.get("x-motor-sim-kv-fallback") == "1"
    # the genuine params still work afterwards (a forged fetch does not consume the lease)
    status, headers, good = await post(d, "/completions", dict(body, kv_transfer_params=ktp))
    assert "x-motor-sim-kv-fallback" not in headers
    assert good["choices"][0]["text"] == forged_resp["choices"][0]["text"]
    missing = {"do_remote_prefill": True, "do_remote_decode": False}
    _, headers, _ = await post(d, "/completions", dict(body, kv_transfer_params=missing))
    assert headers.get("x-motor-sim-kv-fallback") == "1"
    assert (await state(d))["stats"]["kv_transfer_fallbacks"] == 2
    assert (await metric(d, "motor_sim:kv_transfer_fallbacks_total")).endswith(" 2.0")
    assert "recomputing prefill locally" in d.log()


@pytest.mark.slow
async def test_expired_lease_frees_blocks_and_the_decode_fails_the_request(sims: SimFactory) -> None:
    p = sims.vllm("--sim-kv-lease-s", "0.3", role="kv_producer")
    d = sims.vllm(role="kv_consumer")
    body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 4}
    ktp = await prefill(p, body)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not (await state(p))["kv"]["leases"]:
            break
        await asyncio.sleep(0.05)
    ps = await state(p)
    assert ps["kv"]["leases"] == 0 and ps["kv"]["used"] == 0
    assert ps["stats"]["kv_lease_expirations"] == 1
    status, _, resp = await post(d, "/completions", dict(body, kv_transfer_params=ktp))
    assert status == 500 and resp == INTERNAL


def test_unknown_kv_load_failure_policy_is_a_start_up_error() -> None:
    from motor_sim.cli import parse

    with pytest.raises(SystemExit) as exc:
        parse(["vllm", "serve", "m", "--kv-transfer-config",
               '{"kv_connector":"NixlConnector","kv_role":"kv_consumer","kv_load_failure_policy":"retry"}'])
    assert exc.value.code == 2


@pytest.mark.slow
async def test_role_is_enforced(sims: SimFactory) -> None:
    d = sims.vllm(role="kv_consumer")
    status, _, body = await post(d, "/completions", {"prompt": "x", "max_tokens": 1,
                                                     "kv_transfer_params": {"do_remote_decode": True}})
    assert status == 400 and body["error"]["param"] == "kv_transfer_params"
