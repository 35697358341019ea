"""Stored responses (vLLM's ``store``/``background`` Responses API) through a real motor-gateway
and motor-coordinator (and the co-located front), with the real ``openai`` SDK: a response lives in
the memory of the engine that created it, so ``responses.retrieve``, ``responses.cancel`` and a
``previous_response_id`` must reach that engine; with two decode engines the other one answers
404. The coordinator remembers where each answer came from (``response_homes.py``) and asks the
engines in turn for an id it does not know. motor-sim engines keep responses as vLLM 0.32 does
with ``VLLM_ENABLE_RESPONSES_API_STORE=1``."""

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
from tests.helpers import free_port
from tests.procs import Proc, sim_instance, start_coordinator, start_gateway, start_simulator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180), pytest.mark.asyncio(loop_scope="module")]

MODEL = "chat-model"
STORE = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}


@dataclass
class Fleet:
    url: str
    decodes: list[Proc]


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["gateway", "colocated"])
async def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Fleet]:
    tmp = tmp_path_factory.mktemp("stored")
    colocated = request.param == "colocated"
    http_port = free_port()
    async with AsyncExitStack() as st:
        # default latency (5 ms a token): a long background response is still running when cancelled
        p, d1, d2 = await asyncio.gather(
            st.enter_async_context(start_simulator("vllm", "prefill", tmp, model=MODEL, env=STORE)),
            st.enter_async_context(start_simulator("vllm", "decode", tmp, model=MODEL, env=STORE)),
            st.enter_async_context(start_simulator("vllm", "decode", tmp, model=MODEL, env=STORE)))
        # round_robin: consecutive creates alternate between the two decodes whatever the box's
        # load. The default least_load scores each decode by its last scraped load and KV usage,
        # so which one a request lands on depends on when the scrapes fell (seen under load:
        # 3 of 4 responses on one decode, both streamed ones on the same decode)
        coord = await st.enter_async_context(start_coordinator(
            tmp, {"scheduler": {"policy": "round_robin"}}, management_key=KEY,
            extra_args=["--http-port", str(http_port)] if colocated else []))
        stubs = Stubs(coord.address)
        st.push_async_callback(stubs.close)
        await stubs.set(sim_instance(1, Role.PREFILL, MODEL, p), sim_instance(2, Role.DECODE, MODEL, d1),
                        sim_instance(3, Role.DECODE, MODEL, d2))
        if colocated:
            yield Fleet(f"http://127.0.0.1:{http_port}", [d1, d2])
        else:
            gw = await st.enter_async_context(start_gateway(tmp, [coord.address]))
            yield Fleet(gw.url, [d1, d2])


def client(fleet: Fleet) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=fleet.url + "/v1", api_key="x", max_retries=0, timeout=30)


async def call(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.request(method, url, json=body,
                                                       timeout=aiohttp.ClientTimeout(total=30)) as r:
        return r.status, await r.json(content_type=None)


async def lookups(sim: Proc) -> dict[str, int]:
    """The engine's store lookups: found / not_found (motor-sim /sim/state)."""
    status, state = await call("GET", sim.url + "/sim/state")
    assert status == 200
    return {k: state["responses"][k] for k in ("found", "not_found")}


async def holders(fleet: Fleet, response_id: str) -> list[int]:
    """Which decode engines hold *response_id* (asked directly: 200 or vLLM's 404)."""
    out = []
    for i, sim in enumerate(fleet.decodes):
        status, _ = await call("GET", f"{sim.url}/v1/responses/{response_id}")
        assert status in (200, 404)
        if status == 200:
            out.append(i)
    return out


async def test_retrieve_reaches_the_engine_that_stored_each_response(fleet: Fleet) -> None:
    async with client(fleet) as c:
        created = [await c.responses.create(model=MODEL, input=f"hello {i}", max_output_tokens=4, store=True)
                   for i in range(4)]
        homes = [await holders(fleet, r.id) for r in created]
        assert sorted(h[0] for h in homes) == [0, 0, 1, 1] and all(len(h) == 1 for h in homes)  # the other 404s
        before = [await lookups(s) for s in fleet.decodes]
        for r in created:
            got = await c.responses.retrieve(r.id)
            assert (got.id, got.output_text, got.status, got.model) == (r.id, r.output_text, r.status, MODEL)
        after = [await lookups(s) for s in fleet.decodes]
    # each retrieve went straight to its engine: 4 found, not one 404 on the other engine
    assert sum(a["found"] - b["found"] for a, b in zip(after, before, strict=True)) == 4
    assert [a["not_found"] for a in after] == [b["not_found"] for b in before]


async def test_a_streamed_response_is_remembered_from_its_first_event(fleet: Fleet) -> None:
    async with client(fleet) as c:
        finished = []
        for _ in range(2):  # one on each decode engine (round robin)
            stream = await c.responses.create(model=MODEL, input="hello", max_output_tokens=3, store=True,
                                              stream=True)
            events = [e async for e in stream]
            assert events[0].type == "response.created"
            finished.append(events[-1].response)  # type: ignore[union-attr]
        assert sorted([await holders(fleet, r.id) for r in finished]) == [[0], [1]]
        before = [await lookups(s) for s in fleet.decodes]
        for done in finished:
            got = await c.responses.retrieve(done.id)
            assert got.id == done.id and got.output_text == done.output_text and got.status == "incomplete"
        after = [await lookups(s) for s in fleet.decodes]
    assert [a["not_found"] for a in after] == [b["not_found"] for b in before]


async def test_an_id_the_coordinator_never_saw_is_found_by_asking_the_engines(fleet: Fleet) -> None:
    for sim in fleet.decodes:  # created on each engine directly, not through Motor
        status, made = await call("POST", sim.url + "/v1/responses",
                                  {"model": MODEL, "input": "direct", "max_output_tokens": 2})
        assert status == 200
        async with client(fleet) as c:
            got = await c.responses.retrieve(made["id"])
            assert (got.id, got.output_text) == (made["id"], made["output"][0]["content"][0]["text"])
            before = await lookups(sim)
            again = await c.responses.retrieve(made["id"])  # remembered now: straight to it
            assert again.id == made["id"]
            assert (await lookups(sim))["found"] == before["found"] + 1


async def test_an_unknown_id_is_vllms_404_after_asking_every_engine(fleet: Fleet) -> None:
    before = [await lookups(s) for s in fleet.decodes]
    async with client(fleet) as c:
        with pytest.raises(openai.NotFoundError) as err:
            await c.responses.retrieve("resp_0000000000000000")
        with pytest.raises(openai.NotFoundError):
            await c.responses.cancel("resp_0000000000000000")
    assert err.value.status_code == 404
    assert err.value.body == {"message": "Response with id 'resp_0000000000000000' not found.",  # vLLM's words
                              "type": "invalid_request_error", "param": "response_id", "code": 404}
    after = [await lookups(s) for s in fleet.decodes]
    assert [a["not_found"] - b["not_found"] for a, b in zip(after, before, strict=True)] == [2, 2]


async def test_a_continuation_goes_to_the_engine_holding_its_previous_response(fleet: Fleet) -> None:
    async with client(fleet) as c:
        for i in range(3):  # round robin would send every other one to the wrong engine (404 there)
            first = await c.responses.create(model=MODEL, input=f"one {i}", max_output_tokens=2, store=True)
            second = await c.responses.create(model=MODEL, input="two", max_output_tokens=2, store=True,
                                              previous_response_id=first.id)
            assert second.previous_response_id == first.id
            assert await holders(fleet, second.id) == await holders(fleet, first.id)


async def test_a_background_response_is_cancelled_on_its_engine(fleet: Fleet) -> None:
    async with client(fleet) as c:
        queued = await c.responses.create(model=MODEL, input="a long story", max_output_tokens=4000,
                                          store=True, background=True)
        assert queued.status == "queued" and queued.background is True
        running = await c.responses.retrieve(queued.id)
        assert running.status in ("queued", "in_progress")
        cancelled = await c.responses.cancel(queued.id)
        assert cancelled.id == queued.id and cancelled.status == "cancelled"
        assert (await c.responses.retrieve(queued.id)).status == "cancelled"
        # a finished (synchronous) response cannot be cancelled: the engine's 400, relayed
        done = await c.responses.create(model=MODEL, input="short", max_output_tokens=2, store=True)
        with pytest.raises(openai.BadRequestError) as err:
            await c.responses.cancel(done.id)
    assert "Cannot cancel a synchronous response" in err.value.message


async def test_bad_ids_and_queries_are_refused_before_any_engine_is_asked(fleet: Fleet) -> None:
    before = [await lookups(s) for s in fleet.decodes]
    async with client(fleet) as c:
        with pytest.raises(openai.BadRequestError) as err:
            await c.responses.retrieve("r" * 257)
        assert err.value.body["param"] == "response_id" and "at most 256" in err.value.message  # type: ignore[index]
    for path, param in (("/v1/responses/bad%20id!", "response_id"),
                        ("/v1/responses/bad%20id!/cancel", "response_id"),
                        ("/v1/responses/resp_1?stream=maybe", "stream"),
                        ("/v1/responses/resp_1?starting_after=-1", "starting_after"),
                        ("/v1/responses/resp_1?starting_after=99999999999", "starting_after")):
        method = "POST" if path.endswith("/cancel") else "GET"
        status, body = await call(method, fleet.url + path)
        assert status == 400 and body["error"]["param"] == param, (path, body)
    status, body = await call("POST", fleet.url + "/v1/responses",
                              {"model": MODEL, "input": "x", "previous_response_id": "no spaces allowed"})
    assert status == 400 and body["error"]["param"] == "previous_response_id"
    after = [await lookups(s) for s in fleet.decodes]
    assert after == before


async def test_delete_is_not_served_like_vllm_and_says_so(fleet: Fleet) -> None:
    async with client(fleet) as c:
        made = await c.responses.create(model=MODEL, input="keep me", max_output_tokens=2, store=True)
        with pytest.raises(openai.APIStatusError) as err:
            await c.responses.delete(made.id)
        assert err.value.status_code == 405 and "cannot delete" in err.value.message
        assert (await c.responses.retrieve(made.id)).id == made.id  # still there


async def test_retrieve_with_stream_relays_the_engines_answer(fleet: Fleet) -> None:
    async with client(fleet) as c:
        made = await c.responses.create(model=MODEL, input="hi", max_output_tokens=2, store=True)
    # vLLM replays the events of a background stream only; for any other id it answers 400
    status, body = await call("GET", f"{fleet.url}/v1/responses/{made.id}?stream=true&starting_after=0")
    assert status == 400 and body["error"]["param"] == "response_id" and made.id in body["error"]["message"]


async def test_without_the_store_a_response_is_not_kept(tmp_path_factory: pytest.TempPathFactory) -> None:
    """vLLM without VLLM_ENABLE_RESPONSES_API_STORE ignores store=true and refuses background."""
    tmp = tmp_path_factory.mktemp("nostore")
    async with start_simulator("vllm", "decode", tmp, model=MODEL, extra_args=["--sim-zero-latency"]) as sim:
        status, made = await call("POST", sim.url + "/v1/responses", {"model": MODEL, "input": "x", "store": True})
        assert status == 200
        assert (await call("GET", f"{sim.url}/v1/responses/{made['id']}"))[0] == 404
        status, body = await call("POST", sim.url + "/v1/responses",
                                  {"model": MODEL, "input": "x", "background": True})
        assert status == 400 and body["error"]["param"] == "background"


