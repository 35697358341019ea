"""Standalone deployment end to end: real simulator engines (P, D and a union reference), a real
``motor-coordinator`` and ``motor-gateway``, engines registered with the real ``motor register``
CLI, requests sent with the ``openai`` SDK. Runs for the vLLM and the SGLang flavour, each with the
separate gateway and with the coordinator's co-located OpenAI front (``http.port``, no gateway)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from tests.conftest import tool
from tests.helpers import wait_for
from tests.procs import Proc, start_coordinator, start_gateway, start_simulator

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180)]

MODEL = "tiny"
KEY = "e2e-management-key"
PROMPT = "The quick brown fox jumps over the lazy dog because"
MESSAGES: list[Any] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me a story"}]
SAMPLING: dict[str, Any] = {"max_tokens": 12, "temperature": 0.7, "seed": 1234}


@dataclass
class Stack:
    flavour: str
    procs: list[Proc]
    gateway_url: str
    pd: AsyncOpenAI
    union: AsyncOpenAI
    health_before: tuple[int, dict[str, Any]]
    cli_env: dict[str, str]
    # a completion sent before any registration: (HTTP status, Retry-After header, body)
    completion_before: tuple[int, str | None, dict[str, Any]]


async def gateway_health(url: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/ready") as r:
        return r.status, await r.json()


def endpoint_arg(sim: Proc) -> str:
    """The ``--endpoint`` of a simulator: ``IP:PORT[,bootstrap=N][,kv=N]``."""
    text = f"127.0.0.1:{sim.port}"
    if "bootstrap_port" in sim.extra:
        text += f",bootstrap={sim.extra['bootstrap_port']}"
    if "side_channel_port" in sim.extra:
        text += f",kv={sim.extra['side_channel_port']}"
    return text


async def motor_cli(*args: str, env: dict[str, str], timeout: float = 30.0) -> tuple[int, str, str]:
    """Run the real ``motor`` CLI; returns (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        tool("motor"), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **env},
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return int(proc.returncode or 0), out.decode(), err.decode()


async def register_engines(coordinator: str, key_file: Path, model: str, engine: str,
                           engines: Iterable[tuple[str, Proc]]) -> dict[str, str]:
    """Register each (role, simulator) with the coordinator at *coordinator* through the real
    ``motor register add``; returns the CLI environment used (coordinator, management key file)."""
    env = {"MOTOR_COORDINATOR": coordinator, "MOTOR_MANAGEMENT_KEY_FILE": str(key_file)}
    for role, sim in engines:
        rc, out, err = await motor_cli("register", "add", "--role", role, "--model", model,
                                       "--engine", engine, "--endpoint", endpoint_arg(sim), env=env)
        assert rc == 0, f"register {role} on {coordinator} failed:\n{out}\n{err}"
    return env


@pytest_asyncio.fixture(scope="module", loop_scope="module",
                        params=["vllm/gateway", "sglang/gateway", "vllm/co-located", "sglang/co-located"])
async def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    flavour, front = str(request.param).split("/")
    logs = tmp_path_factory.mktemp(f"standalone-{flavour}-{front}")
    async with AsyncExitStack() as es:
        procs = [await es.enter_async_context(start_simulator(flavour, role, logs, model=MODEL))
                 for role in ("prefill", "decode", "union")]
        prefill, decode, union = procs
        if front == "gateway":
            coordinator = await es.enter_async_context(start_coordinator(logs, management_key=KEY))
            gateway = await es.enter_async_context(start_gateway(logs, [coordinator.address]))
            procs += [coordinator, gateway]
            front_url = gateway.url
        else:
            coordinator = await es.enter_async_context(start_coordinator(
                logs, {"http": {"port": 0}}, management_key=KEY))
            procs += [coordinator]
            front_url = f"http://127.0.0.1:{coordinator.ports['http']}"
        health_before = await gateway_health(front_url)
        async with aiohttp.ClientSession() as http, http.post(
            f"{front_url}/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1},
        ) as r:
            completion_before = (r.status, r.headers.get("Retry-After"), await r.json())

        (logs / "cli.key").write_text(KEY)
        env = await register_engines(coordinator.address, logs / "cli.key", MODEL, flavour,
                                     (("prefill", prefill), ("decode", decode)))
        await wait_for(lambda: _ready(front_url), timeout=20, what="front ready after registration")
        pd = AsyncOpenAI(base_url=f"{front_url}/v1", api_key="unused", max_retries=0)
        ref = AsyncOpenAI(base_url=f"{union.url}/v1", api_key="unused", max_retries=0)
        es.push_async_callback(pd.close)
        es.push_async_callback(ref.close)
        yield Stack(flavour, procs, front_url, pd, ref, health_before, env, completion_before)


async def _ready(url: str) -> bool:
    status, _ = await gateway_health(url)
    return status == 200


async def test_readiness_is_503_before_registration_and_200_after(stack: Stack) -> None:
    status, body = stack.health_before
    assert status == 503
    assert body["status"] == "unavailable"
    assert "instance set not received yet" in body["reason"]
    assert await gateway_health(stack.gateway_url) == (200, {"status": "ok"})


async def test_a_request_before_the_first_registration_is_503_with_retry_after_never_404(stack: Stack) -> None:
    status, retry_after, body = stack.completion_before
    assert (status, retry_after, body["error"]["code"]) == (503, "1", "service_unavailable"), body


async def test_models_lists_the_registered_model(stack: Stack) -> None:
    models = await stack.pd.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].owned_by == "motor"


async def test_cli_lists_both_instances_as_json(stack: Stack) -> None:
    rc, out, err = await motor_cli("register", "list", "--json", env=stack.cli_env)
    assert rc == 0, err
    doc = orjson.loads(out)
    assert sorted(i["role"] for i in doc["instances"]) == ["decode", "prefill"]
    assert {i["engine"] for i in doc["instances"]} == {stack.flavour}
    assert doc["summary"]["available"] == 2


async def test_pd_completion_equals_union_completion(stack: Stack) -> None:
    pd = await stack.pd.completions.create(model=MODEL, prompt=PROMPT, **SAMPLING)
    ref = await stack.union.completions.create(model=MODEL, prompt=PROMPT, **SAMPLING)
    assert pd.choices[0].text == ref.choices[0].text
    assert pd.choices[0].text
    assert pd.choices[0].finish_reason == ref.choices[0].finish_reason
    assert pd.usage is not None and ref.usage is not None
    assert pd.usage.completion_tokens == ref.usage.completion_tokens


async def test_pd_streaming_completion_equals_union(stack: Stack) -> None:
    async def text(client: AsyncOpenAI) -> str:
        stream = await client.completions.create(model=MODEL, prompt=PROMPT, stream=True, **SAMPLING)
        return "".join([c.choices[0].text async for c in stream if c.choices])

    assert await text(stack.pd) == await text(stack.union) != ""


async def test_pd_chat_equals_union_chat(stack: Stack) -> None:
    pd = await stack.pd.chat.completions.create(model=MODEL, messages=MESSAGES, **SAMPLING)
    ref = await stack.union.chat.completions.create(model=MODEL, messages=MESSAGES, **SAMPLING)
    assert pd.choices[0].message.content == ref.choices[0].message.content
    assert pd.choices[0].message.content


async def test_pd_streaming_chat_equals_union(stack: Stack) -> None:
    async def text(client: AsyncOpenAI) -> str:
        stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True, **SAMPLING)
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    assert await text(stack.pd) == await text(stack.union) != ""


async def test_unknown_model_is_an_openai_404(stack: Stack) -> None:
    from openai import NotFoundError

    with pytest.raises(NotFoundError):
        await stack.pd.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=2)


async def test_cli_refuses_an_endpoint_already_registered_under_another_role(stack: Stack) -> None:
    rc, out, _ = await motor_cli("register", "list", "--json", env=stack.cli_env)
    prefill = next(i for i in orjson.loads(out)["instances"] if i["role"] == "prefill")
    ep = prefill["endpoints"][0]
    rc, _, err = await motor_cli("register", "add", "--role", "decode", "--model", MODEL, "--engine",
                                 stack.flavour, "--endpoint", f"{ep['ip']}:{ep['port']}",
                                 "--no-health-check", env=stack.cli_env)
    assert rc != 0
    assert "already registered" in err



async def sim_stats(sim: Proc) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{sim.url}/sim/state") as r:
        stats: dict[str, Any] = (await r.json())["stats"]
        return stats


async def test_requests_really_go_through_prefill_then_decode_with_kv_transfer(stack: Stack) -> None:
    prefill, decode = stack.procs[0], stack.procs[1]
    p0, d0 = await sim_stats(prefill), await sim_stats(decode)
    await stack.pd.completions.create(model=MODEL, prompt=PROMPT + " once more", **SAMPLING)
    p1, d1 = await sim_stats(prefill), await sim_stats(decode)
    assert p1["requests_finished"] == p0["requests_finished"] + 1
    assert d1["requests_finished"] == d0["requests_finished"] + 1
    assert d1["kv_transfer_fallbacks"] == d0["kv_transfer_fallbacks"] == 0


async def test_client_disconnect_mid_stream_aborts_the_engine_request(stack: Stack) -> None:
    decode = stack.procs[1]
    before = (await sim_stats(decode))["requests_aborted"]
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2000, "stream": True, "ignore_eos": True}
    async with aiohttp.ClientSession() as s:
        resp = await s.post(f"{stack.gateway_url}/v1/completions", json=body)
        assert resp.status == 200
        await resp.content.readuntil(b"\n\n")  # the stream is flowing
        resp.close()

    async def aborted() -> bool:
        return bool((await sim_stats(decode))["requests_aborted"] > before)

    await wait_for(aborted, timeout=15, what="decode engine to abort the request")
