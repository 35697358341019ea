"""Mid-stream migration end to end (issue 12): a decode engine is SIGKILLed — or SIGSTOPped, so it
hangs without dying — while it streams an answer the client has already partly received; the
stream continues on another decode and the client — the ``openai`` SDK through a real
``motor-gateway`` and ``motor-coordinator``, real ``motor-sim`` engines launched like vLLM / SGLang —
reads one well-formed stream whose text, finish reason and usage equal an uninterrupted run's
(greedy decoding is deterministic). A non-streamed answer whose decode dies is run again on the
other decode and is equally exact. A stream that cannot be continued exactly (stop strings) ends
with an error event saying so.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from motor_common.domain import EngineType, Role
from tests.coordinator.grpc_util import KEY, Stubs
from tests.coordinator.test_dispatch_sim import MODEL, instance, sim_state
from tests.helpers import free_port, wait_for
from tests.procs import Proc, start_coordinator, start_gateway, start_simulator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

ENGINES = {"vllm": EngineType.VLLM, "sglang": EngineType.SGLANG}
SLOW_DECODE = ("--sim-decode-ms-per-token", "40")
INTER_TOKEN = 1.0  # dispatch.inter_token_timeout_sec
MAX_TOKENS = 30
MESSAGES: list[Any] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me a story"}]


@dataclass
class Fleet:
    decodes: list[Proc]
    gateway: Proc
    metrics_url: str

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.gateway.url + "/v1", api_key="x", max_retries=0, timeout=60)

    async def migrations(self) -> float:
        async with aiohttp.ClientSession() as s, s.get(self.metrics_url) as r:
            text = await r.text()
        for line in text.splitlines():
            if line.startswith(f'motor_coordinator_migrations_total{{model="{MODEL}"}} '):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    async def metric(self, name: str) -> float:
        async with aiohttp.ClientSession() as s, s.get(self.metrics_url) as r:
            text = await r.text()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " "))

    async def _busy_decode(self) -> Proc:
        def busy() -> Proc | None:
            for d in self.decodes:
                if d.alive() and sim_state(d)["running"] > 0:
                    return d
            return None

        victim = await wait_for(lambda: asyncio.to_thread(busy), timeout=10, what="a decode generating")
        assert victim is not None
        self.decodes.remove(victim)
        return victim

    async def kill_the_busy_decode(self) -> Proc:
        victim = await self._busy_decode()
        victim.kill()
        return victim

    async def freeze_the_busy_decode(self) -> Proc:
        """SIGSTOP the decode that generates: it hangs mid-stream (its process lives on)."""
        victim = await self._busy_decode()
        victim.popen.send_signal(signal.SIGSTOP)
        return victim


def _cont(p: Proc) -> None:
    try:
        p.popen.send_signal(signal.SIGCONT)
    except ProcessLookupError:
        pass


@asynccontextmanager
async def fleet(engine: str, tmp: Path, decodes: int) -> AsyncIterator[Fleet]:
    etype = ENGINES[engine]
    async with AsyncExitStack() as st:
        procs = await asyncio.gather(
            st.enter_async_context(start_simulator(engine, "prefill", tmp, name="p")),
            *(st.enter_async_context(start_simulator(engine, "decode", tmp, extra_args=SLOW_DECODE, name=f"d{i}"))
              for i in range(decodes)),
        )
        p, ds = procs[0], list(procs[1:])
        for d in ds:  # a frozen decode can be stopped afterwards
            st.callback(_cont, d)
        metrics_port = free_port()
        cfg = {"server": {"metrics_port": metrics_port}, "scheduler": {"policy": "round_robin"},
               "dispatch": {"health_probe_interval_sec": 0.2, "probe_timeout_sec": 0.3,
                            "metrics_scrape_interval_sec": 0, "connect_timeout_sec": 1.0,
                            "inter_token_timeout_sec": INTER_TOKEN}}
        c = await st.enter_async_context(start_coordinator(tmp, cfg, management_key=KEY))
        stubs = Stubs(c.address)
        st.push_async_callback(stubs.close)
        await stubs.set(instance(1, Role.PREFILL, etype, [p]),
                        *(instance(2 + i, Role.DECODE, etype, [d]) for i, d in enumerate(ds)))
        gw = await st.enter_async_context(start_gateway(tmp, [c.address]))
        yield Fleet(ds, gw, f"http://127.0.0.1:{metrics_port}/metrics")


async def completion_stream(f: Fleet, *, kill_after: int | None, freeze: bool = False,
                            **kw: Any) -> tuple[str, str | None, Any, set[str]]:
    """(text, finish_reason, usage, response ids) of a streamed completion; SIGKILL (*freeze*:
    SIGSTOP) its decode after *kill_after* content chunks."""
    stream = await f.client().completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=MAX_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True}, **kw)
    text, finish, usage, ids, n = "", None, None, set(), 0
    async for chunk in stream:
        ids.add(chunk.id)
        for ch in chunk.choices:
            text += ch.text
            finish = ch.finish_reason or finish
            n += bool(ch.text)
        usage = chunk.usage or usage
        if kill_after is not None and n == kill_after:
            await (f.freeze_the_busy_decode() if freeze else f.kill_the_busy_decode())
            kill_after = None
    return text, finish, usage, ids


async def chat_stream(f: Fleet, *, kill_after: int | None, freeze: bool = False) -> tuple[str, str | None, Any, list[str]]:
    stream = await f.client().chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True})
    text, finish, usage, roles, n = "", None, None, [], 0
    async for chunk in stream:
        for ch in chunk.choices:
            if ch.delta.role:
                roles.append(ch.delta.role)
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
            n += bool(ch.delta.content)
        usage = chunk.usage or usage
        if kill_after is not None and n == kill_after:
            await (f.freeze_the_busy_decode() if freeze else f.kill_the_busy_decode())
            kill_after = None
    return text, finish, usage, roles


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_a_stream_whose_decode_dies_continues_on_another_decode_exactly(engine: str, tmp_path: Path) -> None:
    async with fleet(engine, tmp_path, decodes=3) as f:
        ref = await completion_stream(f, kill_after=None)
        assert ref[1] == "length" and ref[2].completion_tokens == MAX_TOKENS
        got = await completion_stream(f, kill_after=5)
        assert got[0] == ref[0]  # the very same text as the uninterrupted run
        assert got[1] == "length"
        assert (got[2].prompt_tokens, got[2].completion_tokens, got[2].total_tokens) == (
            ref[2].prompt_tokens, ref[2].completion_tokens, ref[2].total_tokens)
        assert len(got[3]) == 1, got[3]  # one response id throughout
        assert await f.migrations() == 1

        ref_chat = await chat_stream(f, kill_after=None)
        got_chat = await chat_stream(f, kill_after=7)
        assert got_chat[0] == ref_chat[0] and got_chat[1] == "length"
        assert got_chat[3] == ["assistant"]  # one role event, as in an uninterrupted stream
        assert (got_chat[2].prompt_tokens, got_chat[2].completion_tokens) == (
            ref_chat[2].prompt_tokens, ref_chat[2].completion_tokens)
        assert await f.migrations() == 2


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_a_non_streamed_answer_whose_decode_dies_is_run_again_exactly(engine: str, tmp_path: Path) -> None:
    async with fleet(engine, tmp_path, decodes=2) as f:
        c = f.client()
        ref = await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0)
        task = asyncio.ensure_future(
            c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0))
        victim = await f.kill_the_busy_decode()
        got = await task
        await wait_for(lambda: not victim.alive(), timeout=5, what="the killed decode gone")
        assert got.choices[0].message.content == ref.choices[0].message.content
        assert got.choices[0].finish_reason == "length"
        assert got.usage is not None and ref.usage is not None
        assert got.usage.completion_tokens == ref.usage.completion_tokens == MAX_TOKENS
        # an engine sends a non-streamed answer whole: its death came before the head, so the
        # request was sent to the other decode (a retry, not a continuation)
        assert await f.migrations() == 0


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_a_stream_whose_decode_hangs_continues_on_another_decode_exactly(engine: str, tmp_path: Path) -> None:
    async with fleet(engine, tmp_path, decodes=3) as f:
        ref = await completion_stream(f, kill_after=None)
        t0 = time.monotonic()
        got = await completion_stream(f, kill_after=5, freeze=True)
        took = time.monotonic() - t0
        print(f"\n{engine}: decode SIGSTOPped after 5 of {MAX_TOKENS} tokens: stream complete after {took:.2f} s "
              f"(inter_token_timeout_sec {INTER_TOKEN:g})")
        assert got[0] == ref[0] and got[1] == "length"
        assert (got[2].prompt_tokens, got[2].completion_tokens) == (ref[2].prompt_tokens, ref[2].completion_tokens)
        assert len(got[3]) == 1, got[3]
        assert await f.migrations() == 1
        assert await f.metric("motor_coordinator_stream_stalls_total") == 1
        # detected by the coordinator within the inter-token deadline (+ a loaded box's slack),
        # long before a nodemanager would kill the hung engine (≈ 15-18 s)
        assert took < INTER_TOKEN + 6, took

        ref_chat = await chat_stream(f, kill_after=None)
        got_chat = await chat_stream(f, kill_after=7, freeze=True)
        assert got_chat[0] == ref_chat[0] and got_chat[1] == "length"
        assert got_chat[3] == ["assistant"]
        assert await f.migrations() == 2


async def test_a_hung_stream_that_cannot_be_continued_ends_with_an_error_saying_why(tmp_path: Path) -> None:
    async with fleet("vllm", tmp_path, decodes=2) as f:
        # a stop string makes the stream non-migratable (the engine holds text back to match it)
        with pytest.raises(openai.APIError) as err:
            await completion_stream(f, kill_after=5, freeze=True, stop=["no such stop string"])
        msg = str(err.value)
        assert "stopped sending the answer" in msg and "not continued on another engine" in msg, msg
        assert "stop strings" in msg, msg
        assert await f.migrations() == 0
        assert await f.metric("motor_coordinator_stream_stalls_total") == 1
