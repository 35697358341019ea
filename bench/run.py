"""Router benchmark: Motor vs vllm-router vs sglang-router vs no router, same engines, one run.

    .venv/bin/python bench/run.py [--quick] [--seconds S] [--only motor,direct] [--modes zero,real]

For each latency mode (``zero``: ``--sim-zero-latency``; ``real``: the simulator's default cost
model) and engine flavour (vLLM, SGLang) one prefill and one decode ``motor-sim`` are started;
in front of *the same* engines, in turn:

* ``direct``   — no router: the load generator does the PD hand-off itself (vLLM: prefill with
  ``do_remote_decode`` then decode with the returned ``kv_transfer_params``; SGLang: bootstrap
  room to P and D at once). This is the baseline "added latency" is measured against.
* ``motor``    — motor-gateway + motor-coordinator (default config), engines registered with
  ``motor register add``.
* ``motor-unary`` (only when named in ``--only``) — the same, the gateway with ``multiplex: false``
  (one Dispatch call per request instead of its DispatchMany stream): the A/B of that stream.
* ``motor (co-located)`` — motor-coordinator alone with its co-located OpenAI front
  (``http.port``): the gateway's routes dispatching in process, no gRPC hop.
* ``motor (co-located, 2 front workers)`` — the same with ``http.workers: 2``: two front worker
  processes on the port, each dispatching itself (CPU: the coordinator and its workers).
* ``vllm-router/cache_aware``, ``vllm-router/round_robin`` (vLLM flavour) and
  ``sglang-router/cache_aware`` (SGLang flavour; does not set TCP_NODELAY, so streams stall
  ~44 ms per chunk: reported as users get it).

All targets run at once; each case is measured on every target in turn, the order rotating from
case to case (a shared machine's drifting load favours none). Each is driven by
``bench/loadgen.py`` at concurrency 1, 16, 64, streaming and not. Reported per
case: requests/s, added latency over direct (p50, p99), TTFT p50, time between tokens p50, CPU
seconds per 1,000 requests of the router process tree (Motor = gateway + coordinator), failures,
and ratios to the best peer router of the same flavour. Non-streaming bodies are compared with
direct's byte for byte (ids and timestamps masked). The machine's load average at the start and
end is printed, and a summary per mode and stream flag (markdown: Motor's topologies with
their ratios, the best peer). Results: ``bench/results/<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import re
import sys
import tempfile
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
    ZERO,
    Target,
    start_engines,
    start_motor,
    start_sglang_router,
    start_vllm_router,
    tree_cpu,
)
from bench.loadgen import RunResult, run_load

MAX_TOKENS = 16
_MASK = re.compile(rb'"(id|created|system_fingerprint)":\s*("[^"]*"|\d+|null)')


def make_body_factory(stream: bool) -> Callable[[int], dict[str, Any]]:
    def make(i: int) -> dict[str, Any]:
        return {"model": MODEL, "prompt": f"request {i % 97}: summarise the state of the fleet and the "
                                            f"queue depth of every prefill engine in one sentence",
                "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream}
    return make


def masked(body: bytes) -> bytes:
    return _MASK.sub(rb'"\1":"*"', body)


async def identity_check(target: Target, direct: Target, n: int = 5) -> dict[str, Any]:
    """Non-streaming completions and chat bodies: identical to direct's apart from ids/timestamps."""
    bodies = [make_body_factory(False)(1000 + i) for i in range(n)]
    bodies.append({"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8,
                   "temperature": 0})
    mismatches: list[str] = []
    async with aiohttp.ClientSession() as s:
        dsend = direct.sender()
        for body in bodies:
            ref = (await dsend(s, body)).body
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            async with s.post(target.url + path, data=orjson.dumps(body),
                              headers={"Content-Type": "application/json"}) as r:
                got = await r.read()
            if masked(got) != masked(ref):
                mismatches.append(f"{path}: direct={masked(ref)[:160]!r} got={masked(got)[:160]!r}")
    return {"checked": len(bodies), "identical": len(bodies) - len(mismatches), "mismatches": mismatches[:2]}


async def measure(target: Target, concurrency: int, stream: bool, seconds: float, min_requests: int
                  ) -> dict[str, Any]:
    cpu0 = [0.0]

    def snap() -> None:
        cpu0[0] = tree_cpu(target.pids)

    res: RunResult = await run_load(target.name, target.url + "/v1/completions", make_body_factory(stream),
                                    concurrency=concurrency, requests=min_requests, warmup=min(concurrency, 20),
                                    duration=seconds, send=target.sender(), on_start=snap)
    cpu = tree_cpu(target.pids) - cpu0[0] if target.pids else None
    out = res.summary()
    out["cpu_s_per_1k"] = round(cpu / len(res.samples) * 1000, 3) if cpu is not None and res.samples else None
    out["errors"] = sorted({s.error for s in res.samples if not s.ok})[:3]
    return out


CO_WORKERS = "motor (co-located, 2 front workers)"


def targets_for(flavour: str, only: set[str] | None) -> list[tuple[str, Callable[..., Any]]]:
    out: list[tuple[str, Callable[..., Any]]] = [
        ("motor", lambda e, d: start_motor(e, d)),
        ("motor (co-located)", lambda e, d: start_motor(e, d, co_located=True)),
        (CO_WORKERS, lambda e, d: start_motor(e, d, co_located=True, config={"http": {"workers": 2}},
                                              name=CO_WORKERS))]
    if flavour == "vllm":
        out += [("vllm-router/cache_aware", lambda e, d: start_vllm_router(e, d, "cache_aware")),
                ("vllm-router/round_robin", lambda e, d: start_vllm_router(e, d, "round_robin"))]
    else:
        out += [("sglang-router/cache_aware", lambda e, d: start_sglang_router(e, d, "cache_aware"))]
    picked = [t for t in out if only is None or t[0] in only or t[0].split("/")[0] in only
              or (t[0].startswith("motor") and "motor" in only)]
    if only is not None and "motor-unary" in only:
        # A/B of the gateway's DispatchMany stream: the same gateway with one Dispatch call per request.
        picked.insert(1, ("motor-unary", lambda e, d: start_motor(e, d, gateway_config={"multiplex": False},
                                                                  name="motor-unary")))
    return picked


async def bench_flavour(mode: str, flavour: str, args: argparse.Namespace, log_dir: Path) -> list[dict[str, Any]]:
    """Every target is started first; then each case is measured on every target in turn (the
    order rotating from case to case), so load drifting on a shared machine during the run
    does not favour the targets measured last."""
    rows: list[dict[str, Any]] = []
    sim_args = ZERO if mode == "zero" else REALISTIC
    cases = [(c, s) for s in (False, True) for c in args.concurrency]
    async with start_engines(flavour, log_dir / f"{mode}-{flavour}", sim_args) as engines, AsyncExitStack() as es:
        direct = Target("direct", "", [], engines)
        live: list[tuple[str, Target, dict[str, Any] | None]] = [("direct", direct, None)]
        for name, starter in targets_for(flavour, args.only_set):
            try:
                target = await es.enter_async_context(starter(engines, log_dir / f"{mode}-{flavour}"))
            except Exception as exc:
                print(f"  {mode}/{flavour}/{name}: failed to start: {exc}", flush=True)
                rows.append({"mode": mode, "flavour": flavour, "target": name, "start_error": str(exc)[:500]})
                continue
            live.append((name, target, await identity_check(target, direct)))
        for i, (conc, stream) in enumerate(cases):
            for name, target, ident in live[i % len(live):] + live[:i % len(live)]:
                r = await measure(target, conc, stream, args.seconds, args.min_requests)
                r.update(mode=mode, flavour=flavour, target=name, identity=ident)
                rows.append(r)
                print(f"  {mode:4} {flavour:6} {name:24} c={conc:<3} stream={stream!s:5} "
                      f"rps={r['rps']:>7} p50={r['latency_p50_ms']:>8.2f}ms fail={r['failures']}"
                      f" cpu/1k={r['cpu_s_per_1k']}", flush=True)
    order = {name: k for k, (name, _, _) in enumerate(live)}
    rows.sort(key=lambda r: (order.get(r["target"], len(order)), r.get("stream", False), r.get("concurrency", 0)))
    return rows


def derive(rows: list[dict[str, Any]]) -> None:
    """Added latency over direct and ratios to the best peer of the same flavour/mode/case."""
    key = lambda r: (r["mode"], r["flavour"], r["concurrency"], r["stream"])  # noqa: E731
    direct = {key(r): r for r in rows if r.get("target") == "direct" and "rps" in r}
    for r in rows:
        if "rps" not in r:
            continue
        d = direct.get(key(r))
        if d is not None:
            r["added_p50_ms"] = round(r["latency_p50_ms"] - d["latency_p50_ms"], 3)
            r["added_p99_ms"] = round(r["latency_p99_ms"] - d["latency_p99_ms"], 3)
    for r in rows:
        if "rps" not in r or r["target"] == "direct":
            continue
        peers = [p for p in rows if "rps" in p and key(p) == key(r) and not p["target"].startswith(("direct", "motor"))]
        if not peers:
            continue
        best_rps = max(p["rps"] for p in peers)
        best_add = min(p.get("added_p50_ms", float("inf")) for p in peers)
        cpus = [p["cpu_s_per_1k"] for p in peers if p.get("cpu_s_per_1k") is not None]
        r["x_rps"] = round(r["rps"] / best_rps, 2) if best_rps else None
        # added latency ratio: values near 0 make ratios meaningless; floor the denominator at 0.05 ms
        if "added_p50_ms" in r:
            r["x_added_p50"] = round(max(r["added_p50_ms"], 0.0) / max(best_add, 0.05), 2)
        if cpus and r.get("cpu_s_per_1k") is not None:
            r["x_cpu"] = round(r["cpu_s_per_1k"] / min(cpus), 2)


def fmt(v: Any, width: int, nd: int = 1) -> str:
    if v is None:
        return f"{'-':>{width}}"
    if isinstance(v, float):
        return f"{v:>{width}.{nd}f}"
    return f"{v!s:>{width}}"


def print_table(rows: list[dict[str, Any]]) -> None:
    hdr = (f"{'mode':4} {'flav':6} {'target':26} {'c':>3} {'str':>3} {'req/s':>7} {'x':>5} {'+p50ms':>7} "
           f"{'x':>5} {'+p99ms':>7} {'ttft50':>7} {'tbt50':>6} {'cpu/1k':>6} {'x':>5} {'fail':>4} {'same':>5}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if "rps" not in r:
            print(f"{r['mode']:4} {r['flavour']:6} {r['target']:26} did not start: {r.get('start_error', '')[:60]}")
            continue
        ident = r.get("identity")
        same = f"{ident['identical']}/{ident['checked']}" if ident else "ref"
        print(f"{r['mode']:4} {r['flavour']:6} {r['target']:26} {r['concurrency']:>3} {'y' if r['stream'] else 'n':>3} "
              f"{fmt(r['rps'], 7, 0)} {fmt(r.get('x_rps'), 5, 2)} {fmt(r.get('added_p50_ms'), 7, 2)} "
              f"{fmt(r.get('x_added_p50'), 5, 2)} {fmt(r.get('added_p99_ms'), 7, 2)} "
              f"{fmt(r.get('ttft_p50_ms'), 7, 2)} {fmt(r.get('itl_p50_ms'), 6, 2)} "
              f"{fmt(r.get('cpu_s_per_1k'), 6, 2)} {fmt(r.get('x_cpu'), 5, 2)} {r['failures']:>4} {same:>5}")
    print("x = ratio to the best peer router (vllm-router policies for vLLM, sglang-router for SGLang) "
          "in the same case: req/s higher is better, +p50 and cpu lower are better.\n"
          "+p50/+p99 = latency minus direct (client-side PD hand-off) latency. sglang-router streams "
          "include its ~44 ms Nagle stall (no TCP_NODELAY), as users get it.")


def _cell(r: dict[str, Any] | None, value: str, ratio: str, unit: str, nd: int) -> str:
    if r is None or r.get(value) is None:
        return "-"
    x = r.get(ratio)
    return f"{r[value]:.{nd}f}{unit}" + (f" ({x:.2f}x)" if x is not None else "")


def _pick(rows: list[dict[str, Any]], target: str, flavour: str, conc: int) -> dict[str, Any] | None:
    found = [r for r in rows if r["flavour"] == flavour and r["concurrency"] == conc and r["target"] == target]
    return found[0] if found else None


def _best(rows: list[dict[str, Any]], flavour: str, conc: int, field: str, low: bool) -> dict[str, Any] | None:
    peers = [r for r in rows if r["flavour"] == flavour and r["concurrency"] == conc and r.get(field) is not None
             and not r["target"].startswith(("direct", "motor"))]
    return (min if low else max)(peers, key=lambda r: r[field]) if peers else None


def print_summary(rows: list[dict[str, Any]]) -> None:
    """The issue-17 view, one markdown table per mode and stream flag: Motor's topologies and
    the best peer of each flavour, c=1 added p50 and CPU, c=64 req/s and CPU (x = ratio to the
    best peer in the same case; CPU and +p50 lower is better, req/s higher)."""
    cases = sorted({(r["mode"], r["stream"]) for r in rows if "rps" in r})
    flavours = [f for f in ("vllm", "sglang") if any(r.get("flavour") == f and "rps" in r for r in rows)]
    name = {"vllm": "vLLM", "sglang": "SGLang"}
    for mode, stream in cases:
        print(f"\nsummary: {mode} latency, {'streaming' if stream else 'non-streaming'}")
        cols = [f"{name[f]} {c}" for f in flavours for c in ("c=1 +p50", "c=1 CPU/1k", "c=64 req/s", "c=64 CPU/1k")]
        print("| target | " + " | ".join(cols) + " |")
        print("| --- | " + " | ".join("---" for _ in cols) + " |")

        here = [r for r in rows if "rps" in r and r["mode"] == mode and r["stream"] == stream]
        for target in ("motor", "motor (co-located)", CO_WORKERS):
            cells = []
            for f in flavours:
                c1, c64 = _pick(here, target, f, 1), _pick(here, target, f, 64)
                cells += [_cell(c1, "added_p50_ms", "x_added_p50", " ms", 2), _cell(c1, "cpu_s_per_1k", "x_cpu", " s", 2),
                          _cell(c64, "rps", "x_rps", "", 0), _cell(c64, "cpu_s_per_1k", "x_cpu", " s", 2)]
            label = "motor (gateway + coordinator)" if target == "motor" else target
            print(f"| {label} | " + " | ".join(cells) + " |")
        cells = []
        for f in flavours:
            b = [_best(here, f, 1, "added_p50_ms", True), _best(here, f, 1, "cpu_s_per_1k", True),
                 _best(here, f, 64, "rps", False), _best(here, f, 64, "cpu_s_per_1k", True)]
            cells += [f"{r['added_p50_ms']:.2f} ms ({r['target']})" if (r := b[0]) else "-",
                      f"{r['cpu_s_per_1k']:.2f} s" if (r := b[1]) else "-",
                      f"{r['rps']:.0f}" if (r := b[2]) else "-",
                      f"{r['cpu_s_per_1k']:.2f} s" if (r := b[3]) else "-"]
        print("| best peer | " + " | ".join(cells) + " |")


async def amain(args: argparse.Namespace) -> int:
    started = dt.datetime.now()
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="motor-bench-") as tmp:
        log_dir = Path(tmp)
        for mode in args.modes:
            for flavour in args.flavours:
                rows += await bench_flavour(mode, flavour, args, log_dir)
    derive(rows)
    elapsed = (dt.datetime.now() - started).total_seconds()
    load_after = os.getloadavg()
    load = f"load average (1/5/15 min) {'/'.join(f'{x:.1f}' for x in load_before)} at the start, " \
           f"{'/'.join(f'{x:.1f}' for x in load_after)} at the end"
    print(f"\n# bench/run.py {started:%Y-%m-%d %H:%M}, {os.cpu_count()} CPUs ({platform.machine()}), "
          f"{args.seconds:g}s/case, max_tokens={MAX_TOKENS}, total {elapsed:.0f}s; {load}")
    print_table(rows)
    print_summary(rows)
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{started:%Y%m%d-%H%M%S}.json"
    path.write_bytes(orjson.dumps({"started": started.isoformat(), "cpus": os.cpu_count(),
                                   "load_average": {"start": load_before, "end": load_after},
                                   "args": {k: v for k, v in vars(args).items() if k != "only_set"},
                                   "elapsed_s": elapsed, "rows": rows}, option=orjson.OPT_INDENT_2))
    print(f"results: {path.relative_to(ROOT)}")
    failures = sum(r.get("failures", 0) for r in rows)
    return 1 if failures else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="zero-latency only, c=1 and 64, 1.5 s per case (<= 90 s)")
    ap.add_argument("--seconds", type=float, help="seconds per case (default 3, quick 1.5)")
    ap.add_argument("--min-requests", type=int, default=0, help="at least this many requests per case")
    ap.add_argument("--modes", default=None, help="comma list of zero,real")
    ap.add_argument("--flavours", default="vllm,sglang")
    ap.add_argument("--concurrency", default=None, help="comma list (default 1,16,64)")
    ap.add_argument("--only", default=None, help="comma list of targets (motor, vllm-router, sglang-router, ...)")
    args = ap.parse_args()
    args.seconds = args.seconds or (1.5 if args.quick else 3.0)
    args.modes = (args.modes or ("zero" if args.quick else "zero,real")).split(",")
    args.flavours = args.flavours.split(",")
    args.concurrency = [int(c) for c in (args.concurrency or ("1,64" if args.quick else "1,16,64")).split(",")]
    args.only_set = set(args.only.split(",")) if args.only else None
    from motor_common.runner import install_uvloop

    install_uvloop()
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
