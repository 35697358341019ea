"""Gateway worker processes: throughput, CPU per request, and a model for more cores (not a test).

    .venv/bin/python bench/scale_workers.py [--workers 1,2] [--conc 64] [--seconds 3] [--rounds 2]
                                            [--flavour vllm|sglang] [--no-pinned] [--no-co-located]
    .venv/bin/python bench/scale_workers.py --metrics-cost   # Prometheus multiprocess mode's price

Same zero-latency engines (1 prefill + 1 decode ``motor-sim``) throughout; per round every variant
is started fresh and measured in turn (so drifting load biases none):

* ``gw-N``: ``motor-coordinator`` + ``motor-gateway`` with ``workers: N`` (the supervisor and N
  workers on one port), unpinned;
* ``gw-N@cpu0`` (unless ``--no-pinned``): the same with the whole gateway tier (parent, workers,
  every thread) pinned to CPU 0 and the coordinator to CPU 1 (``sched_setaffinity`` on every task,
  as ``taskset -a``): the gateway's per-core cost when it has exactly one core;
* ``co-located`` (unless ``--no-co-located``): the coordinator's own OpenAI front, one process.

For each: req/s, p50, and CPU microseconds per request of each part (gateway tier, coordinator,
engines, this load generator), the gateway tier's and the coordinator's utilisation (CPU seconds
per wall second), and the load average. Then the model: a front with P cores, one for the
coordinator and P-1 for gateway workers (engines and clients elsewhere) serves at most
``min((P-1) / gateway_cpu_per_request, 1 / coordinator_cpu_per_request)`` requests per second,
with the per-request costs measured here. That is a prediction, not a measurement: this box has
2 cores shared with the engines, the load generator and other users.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import ZERO, Target, start_engines, start_motor, tree_cpu
from bench.loadgen import run_load
from bench.run import make_body_factory


@dataclass
class Row:
    variant: str
    conc: int
    rps: float
    p50_ms: float
    failures: int
    us_gateway: float  # CPU µs per request: gateway tier (parent + workers)
    us_coordinator: float
    us_engines: float
    us_client: float  # this process: the load generator
    util_gateway: float  # CPU seconds per wall second
    util_coordinator: float
    load1: float


def pin(pid: int, cpus: set[int]) -> None:
    """Every task (thread) of *pid* and of its descendants onto *cpus* (``taskset -a -p``)."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for p in procs:
        for tid in os.listdir(f"/proc/{p.pid}/task"):
            try:
                os.sched_setaffinity(int(tid), cpus)
            except (ProcessLookupError, OSError):
                pass


def own_cpu() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


async def measure(t: Target, variant: str, engines_pids: list[int], conc: int, seconds: float,
                  stream: bool) -> Row:
    gw_pid = t.pids[1] if len(t.pids) > 1 else None
    coord_pid = t.pids[0]
    snap: dict[str, float] = {}

    def start() -> None:
        snap.update(gw=tree_cpu([gw_pid]) if gw_pid else 0.0, co=tree_cpu([coord_pid]),
                    en=tree_cpu(engines_pids), me=own_cpu(), wall=time.perf_counter())

    r = await run_load(variant, t.url + "/v1/completions", make_body_factory(stream), concurrency=conc,
                       requests=0, duration=seconds, warmup=conc, on_start=start)
    wall = time.perf_counter() - snap["wall"]
    gw = (tree_cpu([gw_pid]) if gw_pid else 0.0) - snap["gw"]
    co = tree_cpu([coord_pid]) - snap["co"]
    en = tree_cpu(engines_pids) - snap["en"]
    me = own_cpu() - snap["me"]
    n = max(1, len(r.samples))
    s = r.summary()
    return Row(variant, conc, float(s["rps"]), float(s["latency_p50_ms"]), int(s["failures"]),
               gw / n * 1e6, co / n * 1e6, en / n * 1e6, me / n * 1e6, gw / wall, co / wall, os.getloadavg()[0])


def variants(a: argparse.Namespace) -> list[tuple[str, dict[str, Any], bool]]:
    out: list[tuple[str, dict[str, Any], bool]] = []
    for n in a.workers:
        out.append((f"gw-{n}", {"gateway_config": {"workers": n}}, False))
    if a.pinned:
        for n in a.workers:
            out.append((f"gw-{n}@cpu0", {"gateway_config": {"workers": n}}, True))
    if a.co_located:
        out.append(("co-located", {"co_located": True}, False))
    return out


def fmt(r: Row) -> str:
    return (f"{r.variant:11} c={r.conc:<3} req/s {r.rps:7.0f}  p50 {r.p50_ms:7.2f} ms  fail {r.failures}  "
            f"CPU µs/req: gateway {r.us_gateway:6.0f} coordinator {r.us_coordinator:6.0f} "
            f"engines {r.us_engines:6.0f} client {r.us_client:6.0f}  "
            f"util gw {r.util_gateway:4.2f} co {r.util_coordinator:4.2f}  load1 {r.load1:5.2f}")


async def main(a: argparse.Namespace) -> int:
    rows: dict[tuple[str, int], list[Row]] = {}
    print(f"cores {os.cpu_count()}, load average at start {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        async with start_engines(a.flavour, d, ZERO) as e:
            engine_pids = [p.pid for p in (*e.prefills, *e.decodes)]
            for rnd in range(a.rounds):
                for name, kw, pinned in variants(a):
                    async with AsyncExitStack() as es:
                        t = await es.enter_async_context(start_motor(e, d, name=name, **kw))
                        if pinned:
                            pin(t.pids[1], {0})
                            pin(t.pids[0], {1})
                        for c in a.conc:
                            row = await measure(t, name, engine_pids, c, a.seconds, a.stream)
                            rows.setdefault((name, c), []).append(row)
                            print(f"round {rnd} {fmt(row)}", flush=True)
    print(f"load average at end {os.getloadavg()}")
    print("\nmedians:")
    med: dict[tuple[str, int], Row] = {}
    for key, xs in rows.items():
        m = Row(key[0], key[1], *(statistics.median(getattr(x, f) for x in xs) for f in (
            "rps", "p50_ms", "failures", "us_gateway", "us_coordinator", "us_engines", "us_client",
            "util_gateway", "util_coordinator", "load1")))
        m.failures = int(m.failures)
        med[key] = m
        print("  " + fmt(m))
    print("\nmodel (a prediction from the per-request CPU above, not a measurement): one core for the "
          "coordinator, P-1 for gateway workers, engines and clients on other machines")
    for key, m in sorted(med.items()):
        if not key[0].startswith("gw") or m.us_gateway <= 0 or m.us_coordinator <= 0:
            continue
        gw_core, co_core = 1e6 / m.us_gateway, 1e6 / m.us_coordinator
        preds = "  ".join(f"P={p}: {min((p - 1) * gw_core, co_core):6.0f}" for p in (2, 4, 8, 16))
        print(f"  from {key[0]:11} c={key[1]:<3}: one gateway core {gw_core:6.0f} req/s, the coordinator's core "
              f"{co_core:6.0f} req/s -> {preds} req/s")
    failed = sum(m.failures for m in med.values())
    return 1 if failed else 0


_METRICS_COST = """
import os, timeit
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
r = CollectorRegistry()
c = Counter("x_total", "x", ["route", "status"], registry=r).labels("/v1/completions", "200")
h = Histogram("x_seconds", "x", ["route"], registry=r).labels("/v1/completions")
g = Gauge("x_in_flight", "x", ["route"], registry=r, multiprocess_mode="livesum").labels("/v1/completions")
def one():  # what the front does per request: in-flight up and down, a count, a latency
    g.inc(); c.inc(); h.observe(0.003); g.dec()
n = 100000
print(timeit.timeit(one, number=n) / n * 1e6)
"""


def metrics_cost() -> None:
    """Per request, the front's Prometheus updates in one process and in multiprocess mode (what
    each worker pays with workers > 1: every update is a write into a shared mmap file)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        for label, extra in (("one process", {}), ("multiprocess", {"PROMETHEUS_MULTIPROC_DIR": tmp})):
            out = subprocess.run([sys.executable, "-c", _METRICS_COST], env={**env, **extra},
                                 capture_output=True, text=True, check=True).stdout
            print(f"metrics per request ({label}): {float(out):.1f} µs")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


if __name__ == "__main__":
    from motor_common.runner import install_uvloop

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--flavour", default="vllm", choices=["vllm", "sglang"])
    ap.add_argument("--workers", type=_ints, default=[1, 2])
    ap.add_argument("--conc", type=_ints, default=[64])
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--no-pinned", dest="pinned", action="store_false")
    ap.add_argument("--no-co-located", dest="co_located", action="store_false")
    ap.add_argument("--metrics-cost", action="store_true",
                    help="only time the front's metric updates per request, one process vs multiprocess mode")
    args = ap.parse_args()
    if args.metrics_cost:
        metrics_cost()
        sys.exit(0)
    install_uvloop()
    sys.exit(asyncio.run(main(args)))
