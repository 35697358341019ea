"""bench/http_stack.py's relay answers what the engines answer, so its CPU figures are for the real
work: real motor-sim engines (zero latency), the aiohttp relay process the benchmark starts, and the
benchmark's own load generator. Plus its round order and paired ratios. No benchmark figures; the
granian and pyreqwest variants need those packages, which are not dependencies (the benchmark's
docstring says so), so they do not run here; the aiohttp relays and the bare-protocol ones
(``bench/raw_relay.py``, httptools: a dependency) do."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import orjson
import pytest

from bench.common import ZERO, direct_pd, start_engines
from bench.http_stack import (
    PATH,
    STACKS,
    paired,
    prefill_body,
    relay_argv,
    report,
    rotation,
    split_stack,
    start_relay,
)
from bench.loadgen import one_request, run_load
from bench.run import make_body_factory, masked


def test_every_stack_goes_first_once_in_as_many_rounds() -> None:
    orders = [rotation(STACKS, r) for r in range(len(STACKS))]
    assert [o[0] for o in orders] == list(STACKS)
    assert all(sorted(o) == sorted(STACKS) for o in orders)


def test_paired_ratios_are_per_round_and_skip_a_zero_base() -> None:
    res = {("aiohttp", 1): [(100.0, 10.0, 1.0), (200.0, 0.0, 1.0)],
           ("granian", 1): [(50.0, 20.0, 1.0), (300.0, 5.0, 1.0)]}
    assert paired(res, "granian", "aiohttp", 1, 0) == [0.5, 1.5]
    assert paired(res, "granian", "aiohttp", 1, 1) == [2.0]  # the second round's base served nothing
    text = report(res, ["aiohttp", "granian"], [1])
    assert "cpu x1.00 [0.50-1.50]" in text and "rps x2.00" in text


def test_an_unknown_stack_is_refused_and_the_prefill_leg_is_vllms() -> None:
    with pytest.raises(ValueError, match="unknown stack 'hyper'"):
        relay_argv("hyper", 1)
    assert split_stack("granian+reqwest") == ("granian", "reqwest")
    assert split_stack("aiohttp-b") == ("aiohttp-b", "aiohttp")
    assert relay_argv("aiohttp+reqwest", 1)[-4:] == ["--client", "reqwest", "--port", "1"]
    assert relay_argv("raw", 1)[-4:] == ["--client", "raw", "--port", "1"]  # both sides bare protocols
    assert relay_argv("raw+aiohttp", 1)[-4:] == ["--client", "aiohttp", "--port", "1"]
    assert relay_argv("aiohttp+raw", 1)[-4:] == ["--client", "raw", "--port", "1"]
    assert relay_argv("hop", 1)[-5:] == ["front", "--port", "1", "--transport", "grpcio"]  # the back: beside it
    body = prefill_body({"prompt": "x", "max_tokens": 16, "stream": True, "stream_options": {"include_usage": True}})
    assert body["max_tokens"] == 1 and body["stream"] is False and "stream_options" not in body
    assert body["kv_transfer_params"]["do_remote_decode"] is True


@pytest.mark.slow
async def test_the_aiohttp_relays_answer_what_the_engines_answer(tmp_path: Path) -> None:
    async with start_engines("vllm", tmp_path, ZERO) as e:
        p, d = e.prefills[0], e.decodes[0]
        async with start_relay("aiohttp", p.url, d.url, tmp_path) as relay, aiohttp.ClientSession() as s:
            body = make_body_factory(False)(3)
            got = await one_request(s, relay.url + PATH, body)
            want = await direct_pd(s, "vllm", p, d, body, 30.0)
            assert got.ok and want.ok, (got.error, want.error)
            assert masked(got.body) == masked(want.body)
            assert orjson.loads(got.body)["choices"][0]["text"]

            stream = make_body_factory(True)(3)
            sgot = await one_request(s, relay.url + PATH, stream)
            swant = await direct_pd(s, "vllm", p, d, stream, 30.0)
            assert sgot.ok and swant.ok, (sgot.error, swant.error)  # ok: status 200 and "data: [DONE]" seen
            assert sgot.ttft is not None and len(sgot.itl) == len(swant.itl) > 0  # as many events as direct

        async with start_relay("aiohttp-1w", p.url, d.url, tmp_path) as relay, aiohttp.ClientSession() as s:
            one_write = await one_request(s, relay.url + PATH, stream)  # the last chunk goes with the terminator
            assert one_write.ok and len(one_write.itl) == len(swant.itl), one_write.error

            r = await run_load("aiohttp", relay.url + PATH, make_body_factory(False), concurrency=8, requests=40,
                               warmup=2)
            assert r.failures == 0 and len(r.samples) == 40


@pytest.mark.slow
@pytest.mark.parametrize("stack", ["raw", "raw+aiohttp", "aiohttp+raw", "aiohttp+engine", "hop"])
async def test_the_bare_protocol_relays_answer_what_the_engines_answer(stack: str, tmp_path: Path) -> None:
    async with start_engines("vllm", tmp_path, ZERO) as e:
        p, d = e.prefills[0], e.decodes[0]
        async with start_relay(stack, p.url, d.url, tmp_path) as relay, aiohttp.ClientSession() as s:
            for stream in (False, True):
                body = make_body_factory(stream)(5)
                got = await one_request(s, relay.url + PATH, body)
                want = await direct_pd(s, "vllm", p, d, body, 30.0)
                assert got.ok and want.ok, (got.error, want.error)
                if stream:
                    assert got.ttft is not None and len(got.itl) == len(want.itl) > 0  # as many events as direct
                else:
                    assert masked(got.body) == masked(want.body) and orjson.loads(got.body)["choices"][0]["text"]
            async with s.post(relay.url + "/v1/chat", json={}) as resp:  # not the relay's route
                assert resp.status == 404
            r = await run_load(stack, relay.url + PATH, make_body_factory(True), concurrency=8, requests=40, warmup=2)
            assert r.failures == 0 and len(r.samples) == 40  # keep-alive connections reused under load
