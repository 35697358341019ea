"""Front worker processes (gateway and co-located): throughput, CPU per request, and a model for
more cores (not a test).

    .venv/bin/python bench/scale_workers.py [--workers 1,2] [--co-workers 1,2] [--conc 64] [--seconds 3]
                                            [--rounds 2] [--flavour vllm|sglang] [--no-pinned]
                                            [--no-gateway] [--no-co-located]
    .venv/bin/python bench/scale_workers.py --metrics-cost   # Prometheus multiprocess mode's price

Same zero-latency engines (1 prefill + 1 decode ``motor-sim``) throughout; per round every variant
is started fresh and measured in turn (so drifting load biases none):

* ``gw-N``: ``motor-coordinator`` + ``motor-gateway`` with ``workers: N`` (the supervisor and N
  workers on one port), unpinned;
* ``gw-N@cpu0`` (unless ``--no-pinned``): the same with the whole gateway tier (parent, workers,
  every thread) pinned to CPU 0 and the coordinator to CPU 1 (``sched_setaffinity`` on every task,
  as ``taskset -a``): the gateway's per-core cost when it has exactly one core;
* ``co-N`` (unless ``--no-co-located``; N from ``--co-workers``): the coordinator's own OpenAI
  front with ``http: {port, workers: N}``. ``co-1`` is the one-process co-located front; with
  N > 1 the front is N worker processes (children of the coordinator), each dispatching itself,
  and the coordinator process keeps the control plane and one sync stream per worker;
* ``co-N@cpu0`` and ``co-N@spread`` (N > 1, unless ``--no-pinned``): the worker tier (every
  thread of every worker) pinned to CPU 0 and the coordinator process to CPU 1; or worker i on
  CPU i mod 2 and the coordinator unpinned.

The ``gw`` rows are skipped with ``--no-gateway``. For each: req/s, p50, and CPU microseconds per
request of each part, the tier's and the coordinator's utilisation (CPU seconds per wall second),
and the load average. The *tier* is the gateway (parent + workers) for ``gw`` rows and the front
workers (the coordinator's children) for ``co-N`` rows, N > 1; the *coordinator* is the
coordinator process alone for ``co-N`` rows (control plane + sync streams; for ``co-1`` the whole
front) and its whole process tree for ``gw`` rows. Then the model: a front with P cores, one for
the coordinator and P-1 for the tier (engines and clients elsewhere) serves at most
``min((P-1) / tier_cpu_per_request, 1 / coordinator_cpu_per_request)`` requests per second,
with the per-request costs measured here (:func:`front_capacity`). Before the load, each start
waits until the front has settled (workers that answer after the first are still starting) and
reports its *idle* CPU per wall second (tier, coordinator): the background work (heartbeats,
engine health probes and scrapes, load reports) that is paid per worker whatever the rate. That is a prediction, not a
measurement: this box has 2 cores shared with the engines, the load generator and other users.

Each row also splits the tier's and the coordinator's CPU per request by thread
(:func:`thread_cpu`): the event loop (a process's main thread: the HTTP side, the dispatch, the
``DispatchMany`` server side, the scheduler), the threads gRPC's C core starts (EventEngine,
timer, executors), and the rest: threads started from Python (grpc.aio's poller among them, and
asyncio's executor) and threads that ended during the measurement.
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
from dataclasses import dataclass, field
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
    us_gateway: float  # CPU µs per request: the tier (gateway parent + workers, or the front workers)
    us_coordinator: float  # the coordinator: its tree (gw rows), the process alone (co rows)
    us_engines: float
    us_client: float  # this process: the load generator
    util_gateway: float  # CPU seconds per wall second
    util_coordinator: float
    load1: float
    idle_gateway: float = 0.0  # CPU seconds per wall second with no requests: the tier
    idle_coordinator: float = 0.0  # and the coordinator (measured once per start, before the load)
    # CPU µs per request by part and thread group ("gateway loop", "coordinator grpc", ...: THREAD_GROUPS)
    threads: dict[str, float] = field(default_factory=dict)


THREAD_GROUPS = ("loop", "grpc", "other")
# thread names (/proc/<pid>/task/<tid>/comm, at most 15 characters) of gRPC's C core: its timer
# manager, EventEngine and executor threads and their lifeguard. Threads Python starts keep the
# process's name ("python"); among them is grpc.aio's poller, which therefore counts as "other".
_GRPC_THREADS = ("grpc", "event_engine", "lifeguard", "default-execut", "resolver-execu", "global-execut")


def thread_group(pid: int, tid: int, name: str) -> str:
    """Which of :data:`THREAD_GROUPS` thread *tid* of process *pid*, named *name*, belongs to: the
    main thread runs the event loop; gRPC's C core names its threads; anything else is "other"."""
    if tid == pid:
        return "loop"
    if name.startswith(_GRPC_THREADS):
        return "grpc"
    return "other"


def thread_cpu(pids: list[int]) -> dict[str, float]:
    """User+system CPU seconds of processes *pids* together, by :func:`thread_group`. "other" is
    each process's total minus its live loop and gRPC threads, so a thread that ended (its CPU
    stays in the process's total) counts there instead of vanishing."""
    out = dict.fromkeys(THREAD_GROUPS, 0.0)
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            threads = proc.threads()
            total = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        counted = 0.0
        for t in threads:
            try:
                name = Path(f"/proc/{pid}/task/{t.id}/comm").read_text().strip()
            except OSError:  # ended since
                continue
            group = thread_group(pid, t.id, name)
            if group != "other":
                out[group] += t.user_time + t.system_time
                counted += t.user_time + t.system_time
        out["other"] += max(0.0, total.user + total.system - counted)
    return out


def thread_split(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]],
                 requests: int) -> dict[str, float]:
    """CPU µs per request by "<part> <group>" from two :func:`thread_cpu` snapshots per part."""
    n = max(1, requests)
    return {f"{part} {g}": max(0.0, after[part][g] - before[part][g]) / n * 1e6
            for part in before for g in THREAD_GROUPS}


def pin(pid: int, cpus: set[int]) -> None:
    """Every task (thread) of *pid* and of its descendants onto *cpus* (``taskset -a -p``)."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for p in procs:
        for tid in os.listdir(f"/proc/{p.pid}/task"):
            try:
                os.sched_setaffinity(int(tid), cpus)
            except (ProcessLookupError, OSError):
                pass


def pin_each(pids: list[int], cpus: list[set[int]]) -> None:
    """Process tree *pids[i]* onto *cpus[i mod len(cpus)]*."""
    for i, pid in enumerate(pids):
        pin(pid, cpus[i % len(cpus)])


def front_capacity(cores: int, tier_us: float, coordinator_us: float) -> float:
    """Requests per second a front on *cores* cores can serve, predicted from CPU per request: one
    core for the coordinator process (it is one process: it can use one core at most), the other
    ``cores - 1`` for the tier (gateway workers, or the co-located front workers). Engines and
    clients are assumed elsewhere. 0 when there is no core for the tier."""
    if tier_us <= 0 or coordinator_us <= 0:
        raise ValueError("CPU per request must be positive")
    return max(0.0, min((cores - 1) * 1e6 / tier_us, 1e6 / coordinator_us))


def median_row(xs: list[Row]) -> Row:
    """The per-field median of rows of one variant and concurrency (failures as an int)."""
    m = Row(xs[0].variant, xs[0].conc, *(statistics.median(getattr(x, f) for x in xs) for f in (
        "rps", "p50_ms", "failures", "us_gateway", "us_coordinator", "us_engines", "us_client",
        "util_gateway", "util_coordinator", "load1", "idle_gateway", "idle_coordinator")))
    m.failures = int(m.failures)
    m.threads = {k: statistics.median(x.threads.get(k, 0.0) for x in xs) for k in xs[0].threads}
    return m


def settled(rates: list[float], threshold: float, window: int = 2) -> bool:
    """Whether the last *window* CPU rates (CPU seconds per wall second) are all below *threshold*:
    the processes are done starting up (imports, first connections) and idle."""
    return len(rates) >= window and all(r < threshold for r in rates[-window:])


def own_cpu() -> float:
    t = psutil.Process().cpu_times()
    return float(t.user + t.system)


def proc_cpu(pid: int) -> float:
    """User+system CPU seconds of *pid* alone (not its children)."""
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return float(t.user + t.system)


def front_worker_pids(coordinator_pid: int) -> list[int]:
    """The co-located front's worker processes: the coordinator's children."""
    return [c.pid for c in psutil.Process(coordinator_pid).children()]


def part_pids(t: Target) -> dict[str, list[int]]:
    """The processes of each part now (see the module's docstring): "gateway" (the tier) and
    "coordinator"."""
    coord_pid = t.pids[0]
    if len(t.pids) > 1:
        def tree(pid: int) -> list[int]:
            try:
                return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
            except psutil.NoSuchProcess:
                return []
        return {"gateway": tree(t.pids[1]), "coordinator": tree(coord_pid)}
    return {"gateway": front_worker_pids(coord_pid), "coordinator": [coord_pid]}


def parts(t: Target) -> tuple[Any, Any]:
    """(tier CPU seconds, coordinator CPU seconds) readers for *t* (see the module's docstring)."""
    coord_pid = t.pids[0]
    if len(t.pids) > 1:  # gateway + coordinator: the gateway's tree, the coordinator's tree
        return (lambda: tree_cpu([t.pids[1]])), (lambda: tree_cpu([coord_pid]))
    # co-located: the front workers (children, live now), the coordinator process alone
    return (lambda: tree_cpu(front_worker_pids(coord_pid))), (lambda: proc_cpu(coord_pid))


async def idle(t: Target, seconds: float, settle_timeout: float = 30.0) -> tuple[float, float]:
    """Wait (at most *settle_timeout*) until the front is done starting (its CPU below 0.1 core in
    two 0.5 s windows: workers that answer later than the first one are still importing), then its
    CPU per wall second over *seconds* with no requests: (tier, coordinator)."""
    tier, coordinator = parts(t)
    rates: list[float] = []
    deadline = time.monotonic() + settle_timeout
    while not settled(rates, 0.1) and time.monotonic() < deadline:
        c0 = tier() + coordinator()
        await asyncio.sleep(0.5)
        rates.append((tier() + coordinator() - c0) / 0.5)
    g0, c0, w0 = tier(), coordinator(), time.perf_counter()
    await asyncio.sleep(seconds)
    wall = time.perf_counter() - w0
    return (tier() - g0) / wall, (coordinator() - c0) / wall


async def measure(t: Target, variant: str, engines_pids: list[int], conc: int, seconds: float,
                  stream: bool) -> Row:
    tier, coordinator = parts(t)
    snap: dict[str, float] = {}

    by_thread: dict[str, dict[str, float]] = {}
    pids = part_pids(t)

    def start() -> None:
        by_thread.update({part: thread_cpu(ps) for part, ps in pids.items()})
        snap.update(gw=tier(), co=coordinator(), en=tree_cpu(engines_pids), me=own_cpu(),
                    wall=time.perf_counter())

    r = await run_load(variant, t.url + "/v1/completions", make_body_factory(stream), concurrency=conc,
                       requests=0, duration=seconds, warmup=conc, on_start=start)
    wall = time.perf_counter() - snap["wall"]
    gw = tier() - snap["gw"]
    co = coordinator() - snap["co"]
    en = tree_cpu(engines_pids) - snap["en"]
    me = own_cpu() - snap["me"]
    threads = thread_split(by_thread, {part: thread_cpu(ps) for part, ps in pids.items()}, len(r.samples))
    n = max(1, len(r.samples))
    s = r.summary()
    return Row(variant, conc, float(s["rps"]), float(s["latency_p50_ms"]), int(s["failures"]),
               gw / n * 1e6, co / n * 1e6, en / n * 1e6, me / n * 1e6, gw / wall, co / wall, os.getloadavg()[0],
               threads=threads)


def variants(a: argparse.Namespace) -> list[tuple[str, dict[str, Any], str]]:
    """(name, start_motor keywords, pinning: "" | "cpu0" | "spread") per variant, in run order."""
    out: list[tuple[str, dict[str, Any], str]] = []
    if a.gateway:
        for n in a.workers:
            out.append((f"gw-{n}", {"gateway_config": {"workers": n}}, ""))
        if a.pinned:
            for n in a.workers:
                out.append((f"gw-{n}@cpu0", {"gateway_config": {"workers": n}}, "cpu0"))
    if a.co_located:
        for n in a.co_workers:
            out.append((f"co-{n}", {"co_located": True, "config": {"http": {"workers": n}}}, ""))
        if a.pinned:
            for how in ("cpu0", "spread"):
                for n in a.co_workers:
                    if n > 1:
                        out.append((f"co-{n}@{how}", {"co_located": True, "config": {"http": {"workers": n}}},
                                    how))
    return out


def apply_pinning(t: Target, how: str) -> None:
    if not how:
        return
    coord_pid = t.pids[0]
    if len(t.pids) > 1:  # the gateway tier on CPU 0, the coordinator on CPU 1
        pin(t.pids[1], {0})
        pin(coord_pid, {1})
    elif how == "cpu0":  # the front workers on CPU 0, the coordinator process on CPU 1
        pin(coord_pid, {1})
        pin_each(front_worker_pids(coord_pid), [{0}])
    else:  # worker i on CPU i mod 2, the coordinator where the kernel puts it
        pin_each(front_worker_pids(coord_pid), [{0}, {1}])


def fmt(r: Row) -> str:
    return (f"{r.variant:12} c={r.conc:<3} req/s {r.rps:7.0f}  p50 {r.p50_ms:7.2f} ms  fail {r.failures}  "
            f"CPU µs/req: gateway {r.us_gateway:6.0f} coordinator {r.us_coordinator:6.0f} "
            f"engines {r.us_engines:6.0f} client {r.us_client:6.0f}  "
            f"util gw {r.util_gateway:4.2f} co {r.util_coordinator:4.2f}  "
            f"idle gw {r.idle_gateway:5.3f} co {r.idle_coordinator:5.3f}  load1 {r.load1:5.2f}"
            + ("\n      by thread, CPU µs/req: " + "  ".join(f"{k} {v:5.0f}" for k, v in r.threads.items())
               if r.threads else ""))


async def main(a: argparse.Namespace) -> int:
    rows: dict[tuple[str, int], list[Row]] = {}
    print(f"cores {os.cpu_count()}, load average at start {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        async with start_engines(a.flavour, d, ZERO) as e:
            engine_pids = [p.pid for p in (*e.prefills, *e.decodes)]
            for rnd in range(a.rounds):
                for name, kw, pinning in variants(a):
                    async with AsyncExitStack() as es:
                        t = await es.enter_async_context(start_motor(e, d, name=name, **kw))
                        apply_pinning(t, pinning)
                        idle_tier, idle_co = await idle(t, a.idle_seconds)
                        for c in a.conc:
                            row = await measure(t, name, engine_pids, c, a.seconds, a.stream)
                            row.idle_gateway, row.idle_coordinator = idle_tier, idle_co
                            rows.setdefault((name, c), []).append(row)
                            print(f"round {rnd} {fmt(row)}", flush=True)
    print(f"load average at end {os.getloadavg()}")
    print("\nmedians:")
    med: dict[tuple[str, int], Row] = {}
    for key, xs in rows.items():
        med[key] = m = median_row(xs)
        print("  " + fmt(m))
    print("\nmodel (a prediction from the per-request CPU above, not a measurement): one core for the "
          "coordinator, P-1 for the tier (gateway workers, or the co-located front workers), engines and "
          "clients on other machines")
    for key, m in sorted(med.items()):
        if key[0] == "co-1" or m.us_gateway <= 0 or m.us_coordinator <= 0:
            continue  # co-1: one process, nothing to split over cores
        tier = "gateway" if key[0].startswith("gw") else "front worker"
        preds = "  ".join(f"P={p}: {front_capacity(p, m.us_gateway, m.us_coordinator):6.0f}"
                          for p in (2, 4, 8, 16))
        print(f"  from {key[0]:12} c={key[1]:<3}: one {tier} core {1e6 / m.us_gateway:6.0f} req/s, the "
              f"coordinator's core {1e6 / m.us_coordinator:6.0f} req/s -> {preds} req/s")
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
    ap.add_argument("--workers", type=_ints, default=[1, 2], help="gateway workers: gw-N rows")
    ap.add_argument("--co-workers", type=_ints, default=[1, 2], help="co-located front workers: co-N rows")
    ap.add_argument("--conc", type=_ints, default=[64])
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--idle-seconds", type=float, default=2,
                    help="per start: the front's CPU with no requests over this long (after it settles)")
    ap.add_argument("--no-pinned", dest="pinned", action="store_false")
    ap.add_argument("--no-gateway", dest="gateway", action="store_false", help="no gw-N rows")
    ap.add_argument("--no-co-located", dest="co_located", action="store_false", help="no co-N rows")
    ap.add_argument("--metrics-cost", action="store_true",
                    help="only time the front's metric updates per request, one process vs multiprocess mode")
    args = ap.parse_args()
    if args.metrics_cost:
        metrics_cost()
        sys.exit(0)
    install_uvloop()
    sys.exit(asyncio.run(main(args)))
