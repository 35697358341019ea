"""Scheduling quality: prefix-cache hit rate, TTFT and throughput on a realistic chat workload.

    .venv/bin/python bench/scheduling.py [--sessions 40] [--turns 4] [--unique 0.25] [--concurrency 16]

Workload (issue 19): ``--sessions`` multi-turn chats, each opened with one of four long system
prompts (~600 tokens), turn t carrying the whole history; the first user turn of every chat
carries a ~400-token document of its own, so later turns hit the cache only on the engine that
served the chat before. Plus a ``--unique`` share of one-shot chats with a system prompt and
question of their own (nothing to share). Streaming chat completions, max_tokens 8, sent turn by
turn with unique requests interleaved (seeded); with ``--active N`` sessions are staggered (about
N open at once, first turns spread over the run), ``--reply-words`` makes the assistant replies in
the history that long. Engines: 4 prefill + 2 decode ``motor-sim`` with
the simulator's default cost model (prefill 2 ms + 0.05 ms per *uncached* prompt token, decode
5 ms per token), prefix caching on, prefill KV capacity ``--prefill-kv-blocks`` (512 blocks of
16 tokens by default: smaller than what the workload caches, so engines evict); every prefill
engine publishes KV events in every run (the same engine cost for all routers); fresh engines for
every router so every run starts cold.

Routers, in one run: Motor ``round_robin`` (through motor-gateway and through the coordinator's
co-located front), ``prefix_aware`` (the ring) and ``kv_events`` (the engines' KV events,
simulator tokenizer; gateway and co-located); vllm-router ``round_robin`` and ``cache_aware``; on
SGLang engines Motor ``kv_events`` (co-located) and sglang-router ``cache_aware``. Hit rate = prefix-cache hit tokens / queried
tokens summed over the prefill engines (from their /metrics). Figures are benchmark figures, never
pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    MODEL,
    REALISTIC,
    ROOT,
    Engines,
    start_engines,
    start_motor,
    start_sglang_router,
    start_vllm_router,
)
from bench.loadgen import RunResult, one_request, run_load

WORDS = ("fleet engine prefill decode cache token route policy latency budget queue replica shard "
         "tensor batch stream window memory block schedule balance").split()


# words (about tokens) of a system prompt, of a chat's document, of an assistant reply in the history
# (0: a short phrase)
SIZES = {"system": 600, "doc": 400, "reply": 0}


def system_prompt(k: int) -> str:
    return f"System prompt {k}. " + " ".join(WORDS[(k * 7 + i * 3) % len(WORDS)] for i in range(SIZES["system"]))


def document(c: int) -> str:
    """A per-chat document in the first user turn: later turns share it only with their own chat,
    so only a router that keeps a chat on one prefill engine re-uses it."""
    return f"Document {c}: " + " ".join(WORDS[(c * 13 + i * i) % len(WORDS)] + str(i % 7)
                                        for i in range(SIZES["doc"])) + ". "


def unique_chat(u: int) -> list[dict[str, str]]:
    system = f"Unique system prompt {u}: " + " ".join(WORDS[(u * 11 + i * 5) % len(WORDS)] + str(u) for i in range(250))
    return [{"role": "system", "content": system},
            {"role": "user", "content": f"one-shot question {u}: what about the {WORDS[u % 20]}?"}]


def reply(c: int, u: int) -> str:
    """The assistant's answer to turn *u* as the client sends it back in the history: the prefill
    engines never computed it (the decode engine generated it), so every router computes it once;
    a router that moves the chat also recomputes all the history before it."""
    if not SIZES["reply"]:
        return f"the {WORDS[(c * u) % 20]} is fine, thanks {u}"
    return f"Answer {u}: " + " ".join(WORDS[(c * 5 + u * 3 + i * 7) % len(WORDS)] for i in range(SIZES["reply"]))


def session_chat(c: int, t: int) -> list[dict[str, str]]:
    msgs: list[dict[str, str]] = [{"role": "system", "content": system_prompt(c % 4)}]
    for u in range(t + 1):
        doc = document(c) if u == 0 else ""
        msgs.append({"role": "user", "content": f"{doc}chat {c} turn {u}: how is the {WORDS[(c + u) % 20]} doing?"})
        if u < t:
            msgs.append({"role": "assistant", "content": reply(c, u)})
    return msgs


def workload(sessions: int, turns: int, unique: float, seed: int = 19, active: int = 0) -> list[dict[str, Any]]:
    """Turn t of every session, then turn t + 1, ...; or, with *active* > 0, staggered sessions:
    session c opens at c x turns / active and sends one turn per step, so about *active* chats are
    open at any time (a chat service's concurrent users; consecutive turns of a chat are about
    *active* requests apart) and first turns are spread over the run instead of coming in a burst.
    One-shot chats interleaved at random places."""
    rng = random.Random(seed)
    if active > 0:
        order = sorted((c * turns / active + t, c, t) for c in range(sessions) for t in range(turns))
        chats = [session_chat(c, t) for _, c, t in order]
    else:
        chats = [session_chat(c, t) for t in range(turns) for c in range(sessions)]
    n_unique = round(len(chats) * unique / (1 - unique)) if unique < 1 else len(chats)
    for u in range(n_unique):
        chats.insert(rng.randrange(len(chats) + 1), unique_chat(u))
    return [{"model": MODEL, "messages": m, "max_tokens": 8, "temperature": 0, "stream": True} for m in chats]


def _metric_sum(text: str, name: str, labels: str = "") -> float:
    """Sum of the samples of *name* (with or without ``_total``) whose labels contain *labels*."""
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(?:_total)?(?:{{([^}}]*)}})? ([0-9.eE+-]+)$", text, re.M):
        if labels in (m.group(1) or ""):
            total += float(m.group(2))
    return total


def _get(url: str) -> str:
    return str(urllib.request.urlopen(url, timeout=3).read().decode())


def prefill_counts(engines: Engines) -> list[tuple[float, float, float]]:
    """(prefix-cache hit tokens, queried tokens, evicted blocks) of each prefill engine, from its
    /metrics."""
    out = []
    for p in engines.prefills:
        text = _get(p.url + "/metrics")
        evicted = _metric_sum(text, "motor_sim:kv_evicted_blocks")
        if engines.flavour == "vllm":
            out.append((_metric_sum(text, "vllm:prefix_cache_hits"), _metric_sum(text, "vllm:prefix_cache_queries"),
                        evicted))
        else:
            tokens = _metric_sum(text, "sglang:prompt_tokens")
            out.append((_metric_sum(text, "sglang:cache_hit_rate") * tokens, tokens, evicted))
    return out


def coordinator_profile(metrics_url: str) -> dict[str, Any]:
    """Means (ms) of the coordinator's own timeline of a PD request: dispatch -> first token
    relayed, the prefill call, the decode call to its first byte; the kv_events decisions."""
    text = _get(metrics_url)
    out: dict[str, Any] = {}

    def mean(name: str, labels: str) -> float | None:
        n = _metric_sum(text, name + "_count", labels)
        return round(1000 * _metric_sum(text, name + "_sum", labels) / n, 1) if n else None

    out["coord_ttft_ms"] = mean("motor_coordinator_time_to_first_token_seconds", 'mode="pd"')
    out["prefill_ms"] = mean("motor_coordinator_pd_phase_duration_seconds", 'phase="prefill"')
    out["decode_first_byte_ms"] = mean("motor_coordinator_pd_phase_duration_seconds", 'phase="decode_first_byte"')
    for d in ("prefix", "cold", "fallback"):
        v = _metric_sum(text, "motor_coordinator_kv_events_decisions", f'decision="{d}"')
        if v:
            out[f"kv_{d}"] = int(v)
    return out


async def open_loop(url: str, reqs: list[dict[str, Any]], rate: float, seed: int, timeout: float
                    ) -> tuple[RunResult, float]:
    """Poisson arrivals at *rate* per second (seeded: the same instants for every router), each
    request sent at its instant whatever is still in flight. Returns the result and the largest
    lag of a send behind its instant (the load generator keeping up)."""
    rng = random.Random(seed)
    lag = 0.0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        at = 0.0
        tasks = []
        for body in reqs:
            at += rng.expovariate(rate)
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            lag = max(lag, -delay)
            tasks.append(asyncio.create_task(one_request(session, url, body, timeout=timeout)))
        samples = list(await asyncio.gather(*tasks))
        wall = time.perf_counter() - start
    return RunResult("open", 0, True, wall, samples), lag


KV_EVENTS = {"policy": "kv_events", "kv_events": {"tokenizer": "simulator", "block_size": 16}}


async def one(flavour: str, name: str, starter: Callable[..., Any], reqs: list[dict[str, Any]],
              args: argparse.Namespace, log_dir: Path, rate: float) -> dict[str, Any]:
    d = log_dir / name.replace("/", "-").replace(" ", "_")
    sim = ["--sim-prefill-slots", str(args.prefill_slots)]
    async with AsyncExitStack() as es:
        engines = await es.enter_async_context(start_engines(
            flavour, d, REALISTIC, prefills=args.prefills, decodes=args.decodes,
            prefill_args=[*sim, "--sim-num-kv-blocks", str(args.prefill_kv_blocks)],
            decode_args=[*sim, "--sim-num-kv-blocks", str(args.decode_kv_blocks)], kv_events=True))
        target = await es.enter_async_context(starter(engines, d))
        before = prefill_counts(engines)  # the readiness probes' own prompts
        url = target.url + "/v1/chat/completions"
        lag = 0.0
        if rate > 0:
            res, lag = await open_loop(url, reqs, rate, args.seed, timeout=120)
        else:
            res = await run_load(name, url, lambda i: reqs[i] if i >= 0 else reqs[0],
                                 concurrency=args.concurrency, requests=len(reqs), warmup=0, timeout=120)
        after = prefill_counts(engines)
        profile = coordinator_profile(target.metrics_url) if target.metrics_url else {}
    hits = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    queries = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    computed = [(a[1] - b[1]) - (a[0] - b[0]) for a, b in zip(after, before, strict=True)]
    evicted = sum(a[2] - b[2] for a, b in zip(after, before, strict=True))
    s = res.summary()
    ttfts = [x.ttft for x in res.ok if x.ttft is not None]
    return {"flavour": flavour, "router": name, "rate": rate, "hit_rate": round(hits / queries, 3) if queries else 0.0,
            "ttft_p50_ms": s["ttft_p50_ms"], "ttft_p99_ms": s["ttft_p99_ms"], "rps": s["rps"],
            "latency_p50_ms": s["latency_p50_ms"], "failures": s["failures"], "requests": s["requests"],
            # the busiest prefill's share of the computed (uncached) tokens x engines: 1.0 = even
            "computed_skew": round(max(computed) * len(computed) / sum(computed), 2) if sum(computed) else 0.0,
            "send_lag_ms": round(lag * 1000, 1), "evicted_blocks": int(evicted),
            "ttft_mean_ms": round(1000 * statistics.fmean(ttfts), 1) if ttfts else None, **profile,
            # every request's TTFT in send order (None: failed), for where the tail comes from
            "ttfts_ms": [None if x.ttft is None else round(1000 * x.ttft, 1) for x in res.samples]}


def _motor(config: dict[str, Any] | None = None, **kw: Any) -> Callable[..., Any]:
    def start(e: Engines, d: Path) -> Any:
        cfg = json.loads(json.dumps(config or {}))
        cfg.setdefault("server", {})["metrics_port"] = 0  # the coordinator binds any port, reports it
        return start_motor(e, d, config=cfg, **kw)
    return start


def setups(only: str | None) -> list[tuple[str, str, Callable[..., Any]]]:
    kv = {"scheduler": KV_EVENTS}
    out: list[tuple[str, str, Callable[..., Any]]] = [
        ("vllm", "motor/round_robin", _motor(policy="round_robin")),
        ("vllm", "motor/round_robin co-located", _motor(policy="round_robin", co_located=True)),
        ("vllm", "motor/prefix_aware", _motor(policy="prefix_aware")),
        ("vllm", "motor/kv_events", _motor(kv)),
        ("vllm", "motor/kv_events co-located", _motor(kv, co_located=True)),
        ("vllm", "vllm-router/round_robin", lambda e, d: start_vllm_router(e, d, "round_robin")),
        ("vllm", "vllm-router/cache_aware", lambda e, d: start_vllm_router(e, d, "cache_aware")),
        ("sglang", "motor/kv_events co-located", _motor(kv, co_located=True)),
        ("sglang", "sglang-router/round_robin", lambda e, d: start_sglang_router(e, d, "round_robin")),
        ("sglang", "sglang-router/cache_aware", lambda e, d: start_sglang_router(e, d, "cache_aware")),
    ]
    return [s for s in out if only is None or re.search(only, f"{s[0]} {s[1]}")]


def _median(rows: list[dict[str, Any]], key: str) -> float:
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.median(vals) if vals else float("nan")


async def amain(args: argparse.Namespace) -> None:
    SIZES.update(system=args.system_words, doc=args.doc_words, reply=args.reply_words)
    reqs = workload(args.sessions, args.turns, args.unique, active=args.active)
    rates = [float(r) for r in args.rates.split(",")] if args.rates else [0.0]
    started = dt.datetime.now()
    load = [os.getloadavg()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="motor-sched-") as tmp:
        for rnd in range(args.rounds):  # interleaved: every router once per round
            for rate in rates:
                for flavour, name, starter in setups(args.only):
                    row = await one(flavour, name, starter, reqs, args, Path(tmp), rate)
                    row["round"] = rnd
                    rows.append(row)
                    print(f"  { {k: v for k, v in row.items() if k != 'ttfts_ms'} }", flush=True)
            load.append(os.getloadavg())
    mode = (f"open loop, Poisson arrivals (seed {args.seed})" if rates != [0.0]
            else f"closed loop, concurrency {args.concurrency}")
    print(f"\n# bench/scheduling.py {started:%Y-%m-%d %H:%M}, {os.cpu_count()} CPUs, load average (1 min) "
          f"{' / '.join(f'{x[0]:.1f}' for x in load)} (start / after each round); {len(reqs)} streaming chat "
          f"requests ({args.sessions} sessions x {args.turns} turns"
          f"{f' (staggered, ~{args.active} open at once)' if args.active else ''} sharing 4 system prompts of ~{args.system_words} "
          f"words, a ~{args.doc_words}-word document per session, "
          f"{f'~{args.reply_words}-word' if args.reply_words else 'short'} assistant replies, + {args.unique:.0%} one-shot chats), {mode}, "
          f"{args.prefills} P + {args.decodes} D, prefill KV {args.prefill_kv_blocks} blocks, simulator's default "
          f"cost model with --sim-prefill-slots {args.prefill_slots}; medians of {args.rounds} interleaved rounds")
    print(f"{'rate':>5} {'flav':6} {'router':30} {'hit rate':>8} {'ttft p50':>9} {'ttft p99':>9} {'req/s':>7} "
          f"{'skew':>5} {'evicted':>7} {'fail':>4}")
    keys = list(dict.fromkeys((r["rate"], r["flavour"], r["router"]) for r in rows))
    for rate, flavour, router in keys:
        rs = [r for r in rows if (r["rate"], r["flavour"], r["router"]) == (rate, flavour, router)]
        print(f"{rate:>5.0f} {flavour:6} {router:30} {_median(rs, 'hit_rate'):>8.1%} {_median(rs, 'ttft_p50_ms'):>9.1f} "
              f"{_median(rs, 'ttft_p99_ms'):>9.1f} {_median(rs, 'rps'):>7.1f} {_median(rs, 'computed_skew'):>5.2f} "
              f"{_median(rs, 'evicted_blocks'):>7.0f} {sum(r['failures'] for r in rs):>4}")
    motor = [k for k in keys if k[2].startswith("motor")]
    if motor:
        print("\nMotor's timeline of a request (means, ms; medians over rounds): the client's TTFT, the "
              "coordinator's dispatch -> first token relayed, its prefill call, its decode call -> first byte")
        for rate, flavour, router in motor:
            rs = [r for r in rows if (r["rate"], r["flavour"], r["router"]) == (rate, flavour, router)]
            print(f"{rate:>5.0f} {flavour:6} {router:30} client {_median(rs, 'ttft_mean_ms'):>6.1f} coord {_median(rs, 'coord_ttft_ms'):>6.1f} "
                  f"prefill {_median(rs, 'prefill_ms'):>6.1f} decode-first-byte {_median(rs, 'decode_first_byte_ms'):>6.1f}")
    print("sglang-router TTFT includes its ~44 ms first-chunk Nagle stall (no TCP_NODELAY), as users get it.")
    out = ROOT / "bench" / "results" / f"scheduling-{started:%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps({"started": started.isoformat(), "args": vars(args), "load": load, "rows": rows},
                                 option=orjson.OPT_INDENT_2))
    print(f"results: {out.relative_to(ROOT)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=40)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--active", type=int, default=0,
                    help="staggered sessions, about this many open at once (0: turn t of every session, then t + 1)")
    ap.add_argument("--unique", type=float, default=0.25, help="share of one-shot chats (0..1)")
    ap.add_argument("--concurrency", type=int, default=16, help="closed loop (no --rates): requests in flight")
    ap.add_argument("--rates", help="open loop: comma-separated Poisson arrival rates (req/s), e.g. 10,20,30")
    ap.add_argument("--seed", type=int, default=19, help="arrival instants (the same for every router)")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds (every router once per round)")
    ap.add_argument("--system-words", type=int, default=600)
    ap.add_argument("--doc-words", type=int, default=400)
    ap.add_argument("--reply-words", type=int, default=0,
                    help="words of each assistant reply in a chat's history (0: a short phrase)")
    ap.add_argument("--prefill-slots", type=int, default=1,
                    help="motor-sim --sim-prefill-slots: prefills an engine computes at once (0: unbounded)")
    ap.add_argument("--prefills", type=int, default=4)
    ap.add_argument("--decodes", type=int, default=2)
    ap.add_argument("--prefill-kv-blocks", type=int, default=512)
    ap.add_argument("--decode-kv-blocks", type=int, default=4096)
    ap.add_argument("--only", help="regex over 'flavour router': run only the matching setups")
    asyncio.run(amain(ap.parse_args()))


if __name__ == "__main__":
    main()
