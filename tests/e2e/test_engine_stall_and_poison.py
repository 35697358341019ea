"""A hung engine and a poison request, end to end (issue 12): real ``motor-sim`` engines launched
like vLLM / SGLang, a real ``motor-coordinator`` and ``motor-gateway``, the ``openai`` SDK.

* Hung engine: a prefill engine is SIGSTOPped. Requests that reach it once a health probe found
  it silent are failed over to the other prefill within ``dispatch.first_byte_timeout_sec``, long
  before a nodemanager would kill the engine (≈ 15-18 s). The request it was serving when it froze
  is a poison suspect: with ``parole_suspects: true`` it is paroled to the other prefill, answered
  there, and counted cleared.
* Poison request, ``parole_suspects: true``: prefills carry a bug that one request body triggers
  (the simulator's ``poison`` fault: the event loop blocks for ever). The poison request hangs one
  prefill, is paroled to a second one, hangs it too and is convicted: refused with 400, never sent
  to a third, which keeps serving everyone else.
* Poison request, ``parole_suspects: false`` (the default): the poison hangs one prefill, is
  refused after the deadline and never reaches the other.

Health probes do not take an engine out of rotation here (``circuit_breaker_failures`` 1000), so
requests really reach the hung engine; the stall itself does (the breaker trips at once).
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
import psutil
import pytest

from motor_common.domain import EngineType, Role
from tests.coordinator.grpc_util import KEY, Stubs
from tests.coordinator.test_dispatch_sim import MODEL, instance, sim_state
from tests.helpers import free_port, wait_for
from tests.procs import Proc, start_coordinator, start_gateway, start_simulator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

FIRST_BYTE = 1.5
ENGINES = {"vllm": EngineType.VLLM, "sglang": EngineType.SGLANG}


@dataclass
class Fleet:
    prefills: list[Proc]
    d: Proc
    gateway: Proc
    metrics_url: str

    @property
    def p1(self) -> Proc:
        return self.prefills[0]

    @property
    def p2(self) -> Proc:
        return self.prefills[1]

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.gateway.url + "/v1", api_key="x", max_retries=0, timeout=30)

    async def metric(self, name: str, **labels: str) -> float:
        async with aiohttp.ClientSession() as s, s.get(self.metrics_url,
                                                       timeout=aiohttp.ClientTimeout(total=5)) as r:
            text = await r.text()
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        for line in text.splitlines():
            if line.startswith(f"{name}{{{want}}} ") or (not labels and line.startswith(name + " ")):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    async def probe_failed(self, p: Proc) -> bool:
        """The coordinator's health probe of *p* has failed at least once."""
        return await self.metric("motor_coordinator_health_probe_failures_total",
                                 endpoint=f"127.0.0.1:{p.port}") >= 1


PAROLE = {"parole_suspects": True}


@asynccontextmanager
async def fleet(engine: str, tmp: Path, prefill_args: tuple[str, ...] = (), *, prefills: int = 2,
                dispatch: dict[str, Any] | None = None) -> AsyncIterator[Fleet]:
    etype = ENGINES[engine]
    async with AsyncExitStack() as st:
        procs = await asyncio.gather(
            *(st.enter_async_context(start_simulator(engine, "prefill", tmp, extra_args=prefill_args, name=f"p{i + 1}"))
              for i in range(prefills)),
            st.enter_async_context(start_simulator(engine, "decode", tmp, name="d")),
        )
        ps, d = list(procs[:-1]), procs[-1]
        for p in ps:  # whatever happens in the test, the engine can be stopped afterwards
            st.callback(_cont, p)
        metrics_port = free_port()
        cfg = {
            "server": {"metrics_port": metrics_port},
            "scheduler": {"policy": "round_robin"},  # request k goes to prefill k % n (p1 first)
            "dispatch": {"first_byte_timeout_sec": FIRST_BYTE, "health_probe_interval_sec": 0.2,
                         "probe_timeout_sec": 0.3, "metrics_scrape_interval_sec": 0,
                         "circuit_breaker_failures": 1000, "circuit_breaker_cooldown_sec": 0.2,
                         "connect_timeout_sec": 1.0, **(dispatch or {})},
        }
        c = await st.enter_async_context(start_coordinator(tmp, cfg, management_key=KEY))
        stubs = Stubs(c.address)
        st.push_async_callback(stubs.close)
        await stubs.set(*(instance(1 + i, Role.PREFILL, etype, [p]) for i, p in enumerate(ps)),
                        instance(len(ps) + 1, Role.DECODE, etype, [d]))
        gw = await st.enter_async_context(start_gateway(tmp, [c.address]))
        yield Fleet(ps, d, gw, f"http://127.0.0.1:{metrics_port}/metrics")


def _cont(p: Proc) -> None:
    try:
        p.popen.send_signal(signal.SIGCONT)
    except ProcessLookupError:
        pass


async def timed(c: openai.AsyncOpenAI, prompt: str, **kw: Any) -> tuple[str, float]:
    """("ok: <text>" | "<status> <code>", seconds)."""
    t0 = time.monotonic()
    try:
        r = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=4, **kw)
        out = f"ok: {r.choices[0].text}"
    except openai.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        out = f"{exc.status_code} {body.get('code')}"
    return out, time.monotonic() - t0


def stopped(p: Proc) -> bool:
    return psutil.Process(p.pid).status() == psutil.STATUS_STOPPED


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_requests_reaching_a_sigstopped_prefill_fail_over_within_the_first_byte_deadline(
    engine: str, tmp_path: Path
) -> None:
    # a slow prefill (0.8 s), so request 0 is still on p1 when p1 freezes
    async with fleet(engine, tmp_path, ("--sim-prefill-base-ms", "800"), dispatch=PAROLE) as f:
        c = f.client()
        first = asyncio.ensure_future(timed(c, "request zero"))  # seq 0 -> p1
        await wait_for(lambda: asyncio.to_thread(lambda: sim_state(f.p1)["running"] > 0), timeout=10,
                       what="request 0 running on p1")
        f.p1.popen.send_signal(signal.SIGSTOP)
        await wait_for(lambda: stopped(f.p1), timeout=5, what="p1 stopped")
        await wait_for(lambda: f.probe_failed(f.p1), timeout=5, what="a health probe found p1 silent")
        # seq 1..6: half of them are routed to the frozen p1 before its deadline passes
        later = await asyncio.gather(*(timed(c, f"request {i}") for i in range(1, 7)))
        zero = await first
        assert all(out.startswith("ok: ") and len(out) > 4 for out, _ in later), later
        slowest = max(t for _, t in later)
        print(f"\n{engine}: SIGSTOPped prefill, first_byte_timeout_sec {FIRST_BYTE}: 6 requests answered in "
              f"{', '.join(f'{t:.2f}' for _, t in later)} s; the one it was serving answered after {zero[1]:.2f} s")
        # failed over within the deadline (+ one prefill on p2 and a loaded machine's slack), far
        # below the ≈ 15-18 s after which a nodemanager would kill the engine
        assert slowest < FIRST_BYTE + 3.0, later
        # request 0 was being served when p1 froze: a poison suspect, paroled to p2 and answered
        # there (a victim of the freeze, not its cause)
        assert zero[0].startswith("ok: ") and len(zero[0]) > 4, zero
        assert zero[1] < FIRST_BYTE + 3.0, zero
        assert await f.metric("motor_coordinator_engine_stalls_total", role="prefill") >= 2
        assert await f.metric("motor_coordinator_poison_suspects_total", model=MODEL, outcome="paroled") == 1
        assert await f.metric("motor_coordinator_poison_suspects_total", model=MODEL, outcome="cleared") == 1
        assert await f.metric("motor_coordinator_poison_requests_total", model=MODEL) == 0
        st = await asyncio.to_thread(sim_state, f.p2)
        assert st["stats"]["requests_finished"] >= 7
        # p1 is out of rotation while frozen: new requests go to p2 at once
        out, took = await timed(c, "after the freeze")
        assert out.startswith("ok: ") and took < FIRST_BYTE, (out, took)


async def _poison_all(f: Fleet) -> None:
    async with aiohttp.ClientSession() as s:
        for p in f.prefills:  # the same engine bug on every prefill
            async with s.post(p.url + "/sim/fault", json={"mode": "poison", "match": "POISON-PILL"}) as r:
                assert r.status == 200


async def _healthy(p: Proc) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(p.url + "/health", timeout=aiohttp.ClientTimeout(total=1)) as r:
            return r.status == 200
    except (TimeoutError, aiohttp.ClientError):
        return False


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_a_poison_request_hangs_two_prefills_at_most_and_is_convicted(engine: str, tmp_path: Path) -> None:
    async with fleet(engine, tmp_path, prefills=3, dispatch=PAROLE) as f:
        await _poison_all(f)
        c = f.client()
        poison = asyncio.ensure_future(timed(c, "POISON-PILL please"))  # seq 0 -> p1
        await wait_for(lambda: f.probe_failed(f.p1), timeout=5, what="a health probe found p1 hung")
        out, took = await poison
        hung = [p for p in f.prefills if not await _healthy(p)]
        print(f"\n{engine}: poison request convicted after {took:.2f} s; "
              f"{len(hung)} of {len(f.prefills)} prefills hung")
        # one hung engine cannot tell a poison from a freeze: the suspect was paroled to a second
        # prefill, which it hung too: convicted, refused, never sent to a third
        assert out == "400 poison_request_suspected", out
        assert took < 2 * FIRST_BYTE + 3.0, took
        assert len(hung) == 2 and f.p1 in hung, [p.name for p in hung]
        assert await f.metric("motor_coordinator_poison_suspects_total", model=MODEL, outcome="paroled") == 1
        assert await f.metric("motor_coordinator_poison_suspects_total", model=MODEL, outcome="convicted") == 1
        assert await f.metric("motor_coordinator_poison_requests_total", model=MODEL) == 1
        # the third prefill never saw it and serves everyone else
        others = await asyncio.gather(*(timed(c, f"innocent {i}") for i in range(6)))
        assert all(o.startswith("ok: ") for o, _ in others), others


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_without_parole_a_poison_request_hangs_one_prefill_and_is_never_sent_to_the_other(
    engine: str, tmp_path: Path
) -> None:
    async with fleet(engine, tmp_path) as f:  # the default: no parole
        await _poison_all(f)
        c = f.client()
        before = [(await asyncio.to_thread(sim_state, p))["stats"]["requests_finished"] for p in (f.p1, f.p2)]
        poison = asyncio.ensure_future(timed(c, "POISON-PILL please"))  # seq 0 -> p1
        await wait_for(lambda: f.probe_failed(f.p1), timeout=5, what="a health probe found p1 hung")
        # everyone else keeps being served meanwhile (by p2 once p1 hung)
        others = await asyncio.gather(*(timed(c, f"innocent {i}") for i in range(6)))
        out, took = await poison
        print(f"\n{engine}: poison request refused after {took:.2f} s; others answered in "
              f"{', '.join(f'{t:.2f}' for _, t in others)} s")
        assert out == "400 poison_request_suspected", out
        assert took < FIRST_BYTE + 3.0
        assert all(o.startswith("ok: ") for o, _ in others), others
        assert await f.metric("motor_coordinator_poison_requests_total", model=MODEL) == 1
        assert await f.metric("motor_coordinator_poison_suspects_total", model=MODEL, outcome="refused") == 1
        # p2 never saw the poison: it is alive, healthy and serving
        async with aiohttp.ClientSession() as s, s.get(f.p2.url + "/health",
                                                       timeout=aiohttp.ClientTimeout(total=2)) as r:
            assert r.status == 200
        after2 = (await asyncio.to_thread(sim_state, f.p2))["stats"]["requests_finished"]
        assert after2 >= before[1] + 3
        out, took = await timed(c, "still fine")
        assert out.startswith("ok: "), out


async def test_a_request_hung_along_with_a_poison_is_served_and_only_the_poison_is_refused(tmp_path: Path) -> None:
    """p1 serves an innocent request (a slow prefill) when the poison request reaches it and hangs
    it: both are suspects of one group, paroled one at a time. The innocent is answered by another
    prefill; the poison hangs exactly one more and is convicted; the last prefill serves on."""
    async with fleet("vllm", tmp_path, ("--sim-prefill-base-ms", "800"), prefills=3, dispatch=PAROLE) as f:
        await _poison_all(f)
        c = f.client()

        async def running(p: Proc) -> bool:
            return bool((await asyncio.to_thread(sim_state, p))["running"] > 0)

        innocent = asyncio.ensure_future(timed(c, "innocent zero"))  # seq 0 -> p1
        await wait_for(lambda: running(f.p1), timeout=10, what="the innocent request running on p1")
        fillers = [asyncio.ensure_future(timed(c, f"filler {i}")) for i in (1, 2)]  # seq 1, 2 -> p2, p3
        await wait_for(lambda: running(f.prefills[1]), timeout=10, what="filler 1 running on p2")
        await wait_for(lambda: running(f.prefills[2]), timeout=10, what="filler 2 running on p3")
        poison = await timed(c, "POISON-PILL please")  # seq 3 -> p1, which it hangs
        ok, *rest = await asyncio.gather(innocent, *fillers)
        hung = [p.name for p in f.prefills if not await _healthy(p)]
        print(f"\nthe innocent request frozen with the poison answered after {ok[1]:.2f} s, the poison "
              f"refused after {poison[1]:.2f} s; hung: {hung}")
        assert ok[0].startswith("ok: ") and len(ok[0]) > 4, ok
        assert all(o.startswith("ok: ") for o, _ in rest), rest
        assert poison[0] == "400 poison_request_suspected", poison
        assert len(hung) == 2 and f.p1.name in hung, hung
        suspects = {o: await f.metric("motor_coordinator_poison_suspects_total", model=MODEL, outcome=o)
                    for o in ("paroled", "cleared", "convicted", "exonerated", "refused")}
        # both hit p1's first-byte deadline within the same moment, so either goes on parole first:
        # the innocent (answered elsewhere: cleared; then the poison goes and is convicted) or the
        # poison (convicted at once; the innocent is freed as its victim without parole)
        assert suspects in ({"paroled": 2, "cleared": 1, "convicted": 1, "exonerated": 0, "refused": 0},
                            {"paroled": 1, "cleared": 0, "convicted": 1, "exonerated": 1, "refused": 0}), suspects
        assert await f.metric("motor_coordinator_poison_requests_total", model=MODEL) == 1
        out, _ = await timed(c, "still served")
        assert out.startswith("ok: "), out
