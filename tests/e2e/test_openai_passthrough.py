"""The OpenAI/vLLM routes relayed whole to one instance (coordinator ``passthrough.py``), end to end
through a real motor-gateway and motor-coordinator (and the coordinator's co-located front) to
motor-sim engines shaped like vLLM 0.32:
``/v1/embeddings`` and ``/v1/responses`` with the real ``openai`` SDK, ``/tokenize``,
``/detokenize`` and ``/version`` over HTTP, and their input checks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio

from motor_common.domain import Role
from tests.coordinator.grpc_util import KEY, Stubs
from tests.helpers import free_port, wait_for
from tests.procs import Proc, sim_instance, start_coordinator, start_gateway, start_simulator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

CHAT_MODEL = "chat-model"
EMB_MODEL = "emb-model"


@dataclass
class Fleet:
    url: str
    prefill: Proc
    decode: Proc
    emb: Proc


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["gateway", "colocated"])
async def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Fleet]:
    tmp = tmp_path_factory.mktemp("passthrough")
    colocated = request.param == "colocated"
    http_port = free_port()
    async with AsyncExitStack() as st:
        zero = ["--sim-zero-latency"]
        p, d, e = await asyncio.gather(
            st.enter_async_context(start_simulator("vllm", "prefill", tmp, model=CHAT_MODEL, extra_args=zero)),
            st.enter_async_context(start_simulator("vllm", "decode", tmp, model=CHAT_MODEL, extra_args=zero)),
            st.enter_async_context(start_simulator("vllm", "union", tmp, model=EMB_MODEL,
                                                   extra_args=[*zero, "--runner", "pooling"])))
        coord = await st.enter_async_context(start_coordinator(
            tmp, management_key=KEY, extra_args=["--http-port", str(http_port)] if colocated else []))
        stubs = Stubs(coord.address)
        st.push_async_callback(stubs.close)
        await stubs.set(sim_instance(1, Role.PREFILL, CHAT_MODEL, p), sim_instance(2, Role.DECODE, CHAT_MODEL, d),
                        sim_instance(3, Role.UNION, EMB_MODEL, e))
        if colocated:
            yield Fleet(f"http://127.0.0.1:{http_port}", p, d, e)
        else:
            gw = await st.enter_async_context(start_gateway(tmp, [coord.address]))
            yield Fleet(gw.url, p, d, e)


async def call(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.request(method, url, json=body,
                                                       timeout=aiohttp.ClientTimeout(total=30)) as r:
        return r.status, await r.json(content_type=None)


async def served(sim: Proc) -> float:
    async with aiohttp.ClientSession() as s, s.get(sim.url + "/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


def client(fleet: Fleet) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=fleet.url + "/v1", api_key="x", max_retries=0, timeout=30)


async def test_embeddings_with_the_openai_sdk_reach_the_embedding_model(fleet: Fleet) -> None:
    async with client(fleet) as c:
        b64 = await c.embeddings.create(model=EMB_MODEL, input=["the sun", "is hot"])  # SDK default: base64
        flt = await c.embeddings.create(model=EMB_MODEL, input=["the sun", "is hot"], encoding_format="float")
        one = await c.embeddings.create(model=EMB_MODEL, input="the sun", dimensions=8, encoding_format="float")
        assert [d.index for d in b64.data] == [0, 1] and len(b64.data[0].embedding) == 32
        assert [d.embedding for d in b64.data] == [d.embedding for d in flt.data]  # the same vectors either way
        assert flt.data[0].embedding != flt.data[1].embedding
        assert abs(sum(x * x for x in flt.data[0].embedding) - 1.0) < 1e-5
        assert len(one.data[0].embedding) == 8 and flt.model == EMB_MODEL and flt.usage.prompt_tokens == 4
        # a generation model's engines serve no embeddings: their 404, in OpenAI's error shape
        with pytest.raises(openai.NotFoundError) as err:
            await c.embeddings.create(model=CHAT_MODEL, input="x")
        assert err.value.status_code == 404


async def test_responses_with_the_openai_sdk_run_whole_on_a_decode_instance(fleet: Fleet) -> None:
    before = (await served(fleet.prefill), await served(fleet.decode))
    async with client(fleet) as c:
        resp = await c.responses.create(model=CHAT_MODEL, input="hello there", max_output_tokens=5,
                                        instructions="be brief")
    assert resp.object == "response" and resp.model == CHAT_MODEL
    assert resp.output_text.strip() and len(resp.output_text.split()) == 5
    assert resp.usage is not None and resp.usage.output_tokens == 5
    assert (resp.status, resp.incomplete_details and resp.incomplete_details.reason) == (
        "incomplete", "max_output_tokens")
    after = (await served(fleet.prefill), await served(fleet.decode))
    assert after == (before[0], before[1] + 1)  # the decode engine computed it alone, no prefill


async def test_a_streamed_response_is_relayed_event_by_event(fleet: Fleet) -> None:
    async with client(fleet) as c:
        stream = await c.responses.create(model=CHAT_MODEL, input="hello there", max_output_tokens=4, stream=True)
        events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * 4,
                     "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1].response  # type: ignore[union-attr]
    assert text.strip() and done.output_text == text and done.usage is not None and done.usage.output_tokens == 4


async def test_tokenize_detokenize_and_version_are_the_engines_answers(fleet: Fleet) -> None:
    status, tok = await call("POST", fleet.url + "/tokenize", {"model": CHAT_MODEL, "prompt": "the sun is hot"})
    direct = await call("POST", fleet.prefill.url + "/tokenize", {"model": CHAT_MODEL, "prompt": "the sun is hot"})
    assert (status, tok) == direct and tok["count"] == 4 and tok["max_model_len"] == 8192
    status, chat = await call("POST", fleet.url + "/tokenize",
                              {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and chat["count"] > 1
    status, text = await call("POST", fleet.url + "/detokenize", {"model": CHAT_MODEL, "tokens": tok["tokens"]})
    assert (status, text) == (200, {"prompt": "the sun is hot"})
    assert await call("GET", fleet.url + "/version") == (200, {"version": "0.32.0"})


@pytest.mark.parametrize(("path", "body", "status", "param"), [
    ("/tokenize", {"prompt": "x"}, 400, "model"),  # two models served: it must be named
    ("/tokenize", {"model": CHAT_MODEL}, 400, "prompt"),
    ("/tokenize", {"model": CHAT_MODEL, "prompt": 7}, 400, "prompt"),
    ("/detokenize", {"model": CHAT_MODEL, "tokens": [1, -1]}, 400, "tokens"),
    ("/detokenize", {"model": CHAT_MODEL, "tokens": "1 2"}, 400, "tokens"),
    ("/v1/embeddings", {"model": EMB_MODEL}, 400, "input"),
    ("/v1/embeddings", {"model": EMB_MODEL, "input": []}, 400, "input"),
    ("/v1/responses", {"model": CHAT_MODEL}, 400, "input"),
    ("/v1/responses", {"model": CHAT_MODEL, "input": "x", "kv_transfer_params": {}}, 400, "kv_transfer_params"),
    ("/v1/responses", {"model": CHAT_MODEL, "input": "x", "stream": "yes"}, 400, "stream"),
    ("/v1/responses", {"model": "nope", "input": "x"}, 404, "model"),
    ("/tokenize", {"model": "", "prompt": "x"}, 400, "model"),
])
async def test_bad_input_is_refused_with_the_field_named(fleet: Fleet, path: str, body: dict[str, Any],
                                                         status: int, param: str) -> None:
    got, answer = await call("POST", fleet.url + path, body)
    assert got == status, answer
    assert answer["error"]["param"] == param, answer
    assert answer["error"]["message"]


async def test_models_carry_the_engines_own_card_fields(fleet: Fleet) -> None:
    """/v1/models shows vLLM's root, parent, max_model_len and permission as the engines return them
    (learned by the coordinator's scrape loop from one engine of each model)."""
    engine_cards = {}
    for sim, model in ((fleet.prefill, CHAT_MODEL), (fleet.emb, EMB_MODEL)):
        _, own = await call("GET", sim.url + "/v1/models")
        engine_cards[model] = next(c for c in own["data"] if c["id"] == model)

    async def listed() -> dict[str, Any] | None:
        status, body = await call("GET", fleet.url + "/v1/models")
        assert status == 200
        cards = {c["id"]: c for c in body["data"]}
        return cards if all("max_model_len" in c for c in cards.values()) else None

    cards = await wait_for(listed, timeout=30, what="engine cards learned by the coordinator")
    assert set(cards) == {CHAT_MODEL, EMB_MODEL}
    for model, own in engine_cards.items():
        mine = cards[model]
        for key in ("root", "parent", "max_model_len"):
            assert mine[key] == own[key], (model, key)
        # permission objects as the engine wrote them, except `created` (vLLM stamps each answer)
        assert [{k: v for k, v in p.items() if k != "created"} for p in mine["permission"]] == \
            [{k: v for k, v in p.items() if k != "created"} for p in own["permission"]]
        assert mine["owned_by"] == "motor" and mine["object"] == "model"
    async with client(fleet) as c:
        listed_sdk = await c.models.list()
        one = await c.models.retrieve(CHAT_MODEL)
    sdk = {m.id: m for m in listed_sdk.data}
    assert sdk[CHAT_MODEL].model_extra["max_model_len"] == 8192  # type: ignore[index]
    assert one.model_extra["root"] == engine_cards[CHAT_MODEL]["root"]  # type: ignore[index]
