"""vLLM NIXL-style PD hand-off between two real simulator processes."""

from __future__ import annotations

import asyncio
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
    assert set(ktp) >= {"do_remote_prefill", "do_remote_decode", "remote_engine_id",
                        "remote_request_id", "remote_block_ids", "remote_host", "remote_port",
                        "tp_size"}
    assert ktp["do_remote_prefill"] is True and ktp["do_remote_decode"] is False
    assert ktp["remote_port"] == p.ports["side_channel"]
    assert (await state(p))["kv"]["leases"] == 1 and (await state(p))["kv"]["used"] > 0

    status, headers, dresp = await post(d, "/completions", dict(body, kv_transfer_params=ktp))
    _, _, uresp = await post(u, "/completions", body)
    assert status == 200 and "x-motor-sim-kv-fallback" not in headers
    assert dresp["choices"][0]["text"] == uresp["choices"][0]["text"]
    assert dresp["usage"] == uresp["usage"]
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
    import json
    text = "".join(
        json.loads(e[6:])["choices"][0]["delta"].get("content", "")
        for e in raw.split("\n\n") if e.startswith("data: {") and json.loads(e[6:])["choices"])
    assert text == uresp["choices"][0]["message"]["content"]


@pytest.mark.slow
async def test_forged_params_fall_back_to_local_prefill_and_say_so(sims: SimFactory) -> None:
    p = sims.vllm(role="kv_producer")
    d = sims.vllm(role="kv_consumer")
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
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s, s.get(d.url + "/metrics") as r:
        assert 'motor_sim:kv_transfer_fallbacks_total{model_name="sim-model"} 2.0' in await r.text()
    assert "recomputing prefill locally" in d.log()


@pytest.mark.slow
async def test_expired_lease_frees_blocks_and_decode_falls_back(sims: SimFactory) -> None:
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
    status, headers, _ = await post(d, "/completions", dict(body, kv_transfer_params=ktp))
    assert status == 200 and headers.get("x-motor-sim-kv-fallback") == "1"


@pytest.mark.slow
async def test_role_is_enforced(sims: SimFactory) -> None:
    d = sims.vllm(role="kv_consumer")
    status, _, body = await post(d, "/completions", {"prompt": "x", "max_tokens": 1,
                                                     "kv_transfer_params": {"do_remote_decode": True}})
    assert status == 400 and body["error"]["param"] == "kv_transfer_params"
