"""What the interleaved A/B benches share (bench/multiplex_ab.py, bench/tree_ab.py): one variant's
measurement per concurrency (CPU of the Motor process tree per request, req/s, p50) and the medians
over the rounds."""

from __future__ import annotations

import statistics
from typing import Any

from bench.common import tree_cpu
from bench.loadgen import run_load
from bench.run import make_body_factory

# (variant, concurrency) -> one (CPU us per request, req/s, p50 ms) per round
Results = dict[tuple[str, int], list[tuple[float, float, float]]]


async def measure(t: Any, variant: str, rnd: int, conc: list[int], stream: bool, seconds: float,
                  res: Results, *, pids: list[int] | None = None, width: int = 6) -> None:
    """Load the started target *t* (its ``url``; the CPU of *pids*, default ``t.pids``) at each
    concurrency for *seconds*; append to *res* and print, with the first failure if any."""
    pids = t.pids if pids is None else pids
    for c in conc:
        c0 = tree_cpu(pids)
        r = await run_load(variant, t.url + "/v1/completions", make_body_factory(stream),
                           concurrency=c, requests=0, duration=seconds, warmup=20)
        cpu = (tree_cpu(pids) - c0) / max(1, len(r.samples)) * 1e6
        s = r.summary()
        res.setdefault((variant, c), []).append((cpu, s["rps"], s["latency_p50_ms"]))
        print(f"round {rnd} {variant:{width}} c={c:<3} rps={s['rps']:7} p50={s['latency_p50_ms']:7.2f} "
              f"cpu/req={cpu:6.0f}us fail={s['failures']}", flush=True)
        if s["failures"]:
            print(f"  first failure: {next(x.error for x in r.samples if not x.ok)}", flush=True)


def print_medians(res: Results) -> None:
    print("medians:")
    for (v, c), xs in sorted(res.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"  {v:6} c={c:<3} cpu/req {statistics.median(x[0] for x in xs):6.0f}us  "
              f"rps {statistics.median(x[1] for x in xs):7.0f}  p50 {statistics.median(x[2] for x in xs):6.2f}ms")
