"""Scheduling quality: prefix-cache hit rate, TTFT and throughput on a shared-prefix workload.

    .venv/bin/python bench/scheduling.py [--convs 25] [--turns 4] [--concurrency 12]

Workload: ``--convs`` multi-turn chats, each opened with one of four long system prompts (~600
tokens), replayed turn by turn (turn t of every chat carries the whole history), streaming chat
completions with max_tokens 8. The first user turn of every chat carries a ~400-token document of
its own, so later turns hit the cache only on the engine that served the chat before. Engines: 2 prefill + 1 decode ``motor-sim`` with the realistic
cost model (prefill 2 ms + 0.05 ms per *uncached* prompt token, so a prefix-cache hit is visibly
cheaper), fresh engines for every router so every run starts cold. Routers: Motor with
``round_robin``, ``least_load`` and ``prefix_aware``; vllm-router ``cache_aware`` and
``round_robin`` (vLLM engines); sglang-router ``cache_aware`` and Motor ``prefix_aware`` on SGLang
engines. Hit rate = prefix-cache hit tokens / queried tokens summed over the prefill engines
(from their /metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
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


def workload(convs: int, turns: int) -> list[dict[str, Any]]:
    out = []
    for t in range(turns):
        for c in range(convs):
            msgs: list[dict[str, str]] = [{"role": "system", "content": system_prompt(c % 4)}]
            for u in range(t + 1):
                doc = document(c) if u == 0 else ""
                msgs.append({"role": "user",
                             "content": f"{doc}chat {c} turn {u}: how is the {WORDS[(c + u) % 20]} doing?"})
                if u < t:
                    msgs.append({"role": "assistant", "content": f"the {WORDS[(c * u) % 20]} is fine, thanks {u}"})
            out.append({"model": MODEL, "messages": msgs, "max_tokens": 8, "temperature": 0, "stream": True})
    return out


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


async def one(flavour: str, name: str, starter: Callable[..., Any], reqs: list[dict[str, Any]], conc: int,
              log_dir: Path) -> dict[str, Any]:
    async with start_engines(flavour, log_dir / name.replace("/", "-"), REALISTIC, prefills=2) as engines, \
            starter(engines, log_dir / name.replace("/", "-")) as target:
        base = hit_rate(engines)  # the readiness probes' own prompts
        res = await run_load(name, target.url + "/v1/chat/completions", lambda i: reqs[i] if i >= 0 else reqs[0],
                             concurrency=conc, requests=len(reqs), warmup=0, timeout=120)
        rate = hit_rate(engines)
    s = res.summary()
    return {"flavour": flavour, "router": name, "hit_rate": round(rate, 3), "hit_rate_before": round(base, 3),
            "ttft_p50_ms": s["ttft_p50_ms"], "ttft_p99_ms": s["ttft_p99_ms"], "rps": s["rps"],
            "latency_p50_ms": s["latency_p50_ms"], "failures": s["failures"], "requests": s["requests"]}


async def amain(args: argparse.Namespace) -> None:
    reqs = workload(args.convs, args.turns)
    started = dt.datetime.now()
    setups: list[tuple[str, str, Callable[..., Any]]] = [
        ("vllm", f"motor/{p}", lambda e, d, p=p: start_motor(e, d, policy=p))
        for p in ("round_robin", "least_load", "prefix_aware")]
    setups += [("vllm", "vllm-router/cache_aware", lambda e, d: start_vllm_router(e, d, "cache_aware")),
               ("vllm", "vllm-router/round_robin", lambda e, d: start_vllm_router(e, d, "round_robin")),
               ("sglang", "motor/prefix_aware", lambda e, d: start_motor(e, d, policy="prefix_aware")),
               ("sglang", "sglang-router/cache_aware", lambda e, d: start_sglang_router(e, d, "cache_aware"))]
    rows = []
    with tempfile.TemporaryDirectory(prefix="motor-sched-") as tmp:
        for flavour, name, starter in setups:
            row = await one(flavour, name, starter, reqs, args.concurrency, Path(tmp))
            rows.append(row)
            print(f"  {row}", flush=True)
    print(f"\n# bench/scheduling.py {started:%Y-%m-%d %H:%M}, {os.cpu_count()} CPUs; {len(reqs)} streaming chat "
          f"requests ({args.convs} chats x {args.turns} turns, 4 system prompts of ~600 tokens), "
          f"concurrency {args.concurrency}, 2 P + 1 D, realistic latency")
    print(f"{'flav':6} {'router':26} {'hit rate':>8} {'ttft p50':>9} {'ttft p99':>9} {'req/s':>7} {'fail':>4}")
    for r in rows:
        print(f"{r['flavour']:6} {r['router']:26} {r['hit_rate']:>8.1%} {r['ttft_p50_ms']:>9.1f} "
              f"{r['ttft_p99_ms']:>9.1f} {r['rps']:>7.1f} {r['failures']:>4}")
    print("sglang-router TTFT includes its ~44 ms first-chunk Nagle stall (no TCP_NODELAY), as users get it.")
    out = ROOT / "bench" / "results" / f"scheduling-{started:%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps({"started": started.isoformat(), "args": vars(args), "rows": rows},
                                 option=orjson.OPT_INDENT_2))
    print(f"results: {out.relative_to(ROOT)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--convs", type=int, default=25)  # odd: round robin must not pin chats by parity
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=12)
    asyncio.run(amain(ap.parse_args()))


if __name__ == "__main__":
    main()
