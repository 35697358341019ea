"""Scheduling quality: prefix-cache hit rate, TTFT and throughput on a realistic chat workload.

    .venv/bin/python bench/scheduling.py [--sessions 40] [--turns 4] [--unique 0.25] [--concurrency 16]

Workload (issue 19): ``--sessions`` multi-turn chats, each opened with one of four long system
prompts (~600 tokens), turn t carrying the whole history; the first user turn of every chat
carries a ~400-token document of its own, so later turns hit the cache only on the engine that
served the chat before. Plus a ``--unique`` share of one-shot chats with a system prompt and
question of their own (nothing to share). Streaming chat completions, max_tokens 8, sent turn by
turn with unique requests interleaved (seeded). Engines: 4 prefill + 2 decode ``motor-sim`` with
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
import os
import random
import re
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
from bench.loadgen import run_load

WORDS = ("fleet engine prefill decode cache token route policy latency budget queue replica shard "
         "tensor batch stream window memory block schedule balance").split()


def system_prompt(k: int) -> str:
    return f"System prompt {k}. " + " ".join(WORDS[(k * 7 + i * 3) % len(WORDS)] for i in range(600))


def document(c: int) -> str:
    """A per-chat document (~400 tokens) in the first user turn: later turns share it only with
    their own chat, so only a router that keeps a chat on one prefill engine re-uses it."""
    return f"Document {c}: " + " ".join(WORDS[(c * 13 + i * i) % len(WORDS)] + str(i % 7) for i in range(400)) + ". "


def unique_chat(u: int) -> list[dict[str, str]]:
    system = f"Unique system prompt {u}: " + " ".join(WORDS[(u * 11 + i * 5) % len(WORDS)] + str(u) for i in range(250))
    return [{"role": "system", "content": system},
            {"role": "user", "content": f"one-shot question {u}: what about the {WORDS[u % 20]}?"}]


def session_chat(c: int, t: int) -> list[dict[str, str]]:
    msgs: list[dict[str, str]] = [{"role": "system", "content": system_prompt(c % 4)}]
    for u in range(t + 1):
        doc = document(c) if u == 0 else ""
        msgs.append({"role": "user", "content": f"{doc}chat {c} turn {u}: how is the {WORDS[(c + u) % 20]} doing?"})
        if u < t:
            msgs.append({"role": "assistant", "content": f"the {WORDS[(c * u) % 20]} is fine, thanks {u}"})
    return msgs


def workload(sessions: int, turns: int, unique: float, seed: int = 19) -> list[dict[str, Any]]:
    """Turn t of every session, then turn t + 1, ...; one-shot chats interleaved at random places."""
    rng = random.Random(seed)
    chats = [session_chat(c, t) for t in range(turns) for c in range(sessions)]
    n_unique = round(len(chats) * unique / (1 - unique)) if unique < 1 else len(chats)
    for u in range(n_unique):
        chats.insert(rng.randrange(len(chats) + 1), unique_chat(u))
    return [{"model": MODEL, "messages": m, "max_tokens": 8, "temperature": 0, "stream": True} for m in chats]


def _metric_sum(text: str, name: str) -> float:
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(?:_total)?(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M):
        total += float(m.group(1))
    return total


def hit_rate(engines: Engines) -> float:
    hits = queries = 0.0
    for p in engines.prefills:
        text = urllib.request.urlopen(p.url + "/metrics", timeout=3).read().decode()
        if engines.flavour == "vllm":
            hits += _metric_sum(text, "vllm:prefix_cache_hits")
            queries += _metric_sum(text, "vllm:prefix_cache_queries")
        else:
            tokens = _metric_sum(text, "sglang:prompt_tokens")
            hits += _metric_sum(text, "sglang:cache_hit_rate") * tokens
            queries += tokens
    return hits / queries if queries else 0.0


KV_EVENTS = {"policy": "kv_events", "kv_events": {"tokenizer": "simulator", "block_size": 16}}


async def one(flavour: str, name: str, starter: Callable[..., Any], reqs: list[dict[str, Any]],
              args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    d = log_dir / name.replace("/", "-").replace(" ", "_")
    async with start_engines(flavour, d, REALISTIC, prefills=args.prefills, decodes=args.decodes,
                             prefill_args=["--sim-num-kv-blocks", str(args.prefill_kv_blocks)],
                             decode_args=["--sim-num-kv-blocks", str(args.decode_kv_blocks)],
                             kv_events=True) as engines, starter(engines, d) as target:
        base = hit_rate(engines)  # the readiness probes' own prompts
        res = await run_load(name, target.url + "/v1/chat/completions", lambda i: reqs[i] if i >= 0 else reqs[0],
                             concurrency=args.concurrency, requests=len(reqs), warmup=0, timeout=120)
        rate = hit_rate(engines)
    s = res.summary()
    return {"flavour": flavour, "router": name, "hit_rate": round(rate, 3), "hit_rate_before": round(base, 3),
            "ttft_p50_ms": s["ttft_p50_ms"], "ttft_p99_ms": s["ttft_p99_ms"], "rps": s["rps"],
            "latency_p50_ms": s["latency_p50_ms"], "failures": s["failures"], "requests": s["requests"]}


def setups(only: str | None) -> list[tuple[str, str, Callable[..., Any]]]:
    out: list[tuple[str, str, Callable[..., Any]]] = [
        ("vllm", "motor/round_robin", lambda e, d: start_motor(e, d, policy="round_robin")),
        ("vllm", "motor/round_robin co-located", lambda e, d: start_motor(e, d, policy="round_robin", co_located=True)),
        ("vllm", "motor/prefix_aware", lambda e, d: start_motor(e, d, policy="prefix_aware")),
        ("vllm", "motor/kv_events", lambda e, d: start_motor(e, d, config={"scheduler": KV_EVENTS})),
        ("vllm", "motor/kv_events co-located",
         lambda e, d: start_motor(e, d, config={"scheduler": KV_EVENTS}, co_located=True)),
        ("vllm", "vllm-router/round_robin", lambda e, d: start_vllm_router(e, d, "round_robin")),
        ("vllm", "vllm-router/cache_aware", lambda e, d: start_vllm_router(e, d, "cache_aware")),
        ("sglang", "motor/kv_events co-located",
         lambda e, d: start_motor(e, d, config={"scheduler": KV_EVENTS}, co_located=True)),
        ("sglang", "sglang-router/cache_aware", lambda e, d: start_sglang_router(e, d, "cache_aware")),
    ]
    return [s for s in out if only is None or re.search(only, f"{s[0]} {s[1]}")]


async def amain(args: argparse.Namespace) -> None:
    reqs = workload(args.sessions, args.turns, args.unique)
    started = dt.datetime.now()
    rows = []
    with tempfile.TemporaryDirectory(prefix="motor-sched-") as tmp:
        for flavour, name, starter in setups(args.only):
            row = await one(flavour, name, starter, reqs, args, Path(tmp))
            rows.append(row)
            print(f"  {row}", flush=True)
    print(f"\n# bench/scheduling.py {started:%Y-%m-%d %H:%M}, {os.cpu_count()} CPUs; {len(reqs)} streaming chat "
          f"requests ({args.sessions} sessions x {args.turns} turns sharing 4 system prompts of ~600 tokens, "
          f"+ {args.unique:.0%} one-shot chats), concurrency {args.concurrency}, {args.prefills} P + {args.decodes} D, "
          f"prefill KV {args.prefill_kv_blocks} blocks, simulator's default cost model")
    print(f"{'flav':6} {'router':30} {'hit rate':>8} {'ttft p50':>9} {'ttft p99':>9} {'req/s':>7} {'fail':>4}")
    for r in rows:
        print(f"{r['flavour']:6} {r['router']:30} {r['hit_rate']:>8.1%} {r['ttft_p50_ms']:>9.1f} "
              f"{r['ttft_p99_ms']:>9.1f} {r['rps']:>7.1f} {r['failures']:>4}")
    print("sglang-router TTFT includes its ~44 ms first-chunk Nagle stall (no TCP_NODELAY), as users get it.")
    out = ROOT / "bench" / "results" / f"scheduling-{started:%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps({"started": started.isoformat(), "args": vars(args), "rows": rows},
                                 option=orjson.OPT_INDENT_2))
    print(f"results: {out.relative_to(ROOT)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=40)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--unique", type=float, default=0.25, help="share of one-shot chats (0..1)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--prefills", type=int, default=4)
    ap.add_argument("--decodes", type=int, default=2)
    ap.add_argument("--prefill-kv-blocks", type=int, default=512)
    ap.add_argument("--decode-kv-blocks", type=int, default=4096)
    ap.add_argument("--only", help="regex over 'flavour router': run only the matching setups")
    asyncio.run(amain(ap.parse_args()))


if __name__ == "__main__":
    main()
