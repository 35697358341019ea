"""Where a router's CPU per request goes, outside Python profilers (not a test).

    .venv/bin/python bench/router_costs.py [--targets motor-co,motor,vllm-router] [--conc 1,64]
                                           [--seconds 4] [--strace]

For each target in front of the same two zero-latency vLLM simulators (``motor-co``: Motor's
co-located front; ``motor``: gateway + coordinator, what ``motor up`` starts; ``vllm-router``:
the peer, round robin, ``scripts/routers-setup``), loaded by ``bench/loadgen.py``: user and system
CPU microseconds per request of each of its processes (psutil), and with ``--strace`` (strace
installed; it slows the process, so the CPU figures of that pass are not printed) the system
calls per request of its first process, ``strace -c -f`` over a load of the same length.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ZERO, Engines, start_engines, start_motor, start_vllm_router
from bench.loadgen import run_load
from bench.run import make_body_factory


def _target(name: str, e: Engines, d: Path) -> AbstractAsyncContextManager[Any]:
    if name == "motor-co":
        return start_motor(e, d, name=name, co_located=True)
    if name == "motor":
        return start_motor(e, d, name=name)
    if name == "vllm-router":
        return start_vllm_router(e, d, "round_robin")
    raise SystemExit(f"unknown target {name!r}: motor-co, motor or vllm-router")


def _times(pids: list[int]) -> list[tuple[float, float]]:
    return [(t.user, t.system) for t in (psutil.Process(p).cpu_times() for p in pids)]


def _syscalls(path: Path, n: int) -> str:
    """``strace -c``'s table as calls per request (those made at least once per 20 requests)."""
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[3].isdigit() and int(parts[3]) / n >= 0.05:
            out.append(f"{parts[-1]} {int(parts[3]) / n:.2f}")
    return ", ".join(out)


async def main(a: argparse.Namespace) -> None:
    body = make_body_factory(False)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        async with start_engines("vllm", d, ZERO) as e:
            for name in a.targets:
                async with _target(name, e, d) as t:
                    url = t.url + "/v1/completions"
                    for c in a.conc:
                        await run_load("warm", url, body, concurrency=c, requests=0, duration=1, warmup=20)
                        before = _times(t.pids)
                        r = await run_load(name, url, body, concurrency=c, requests=0, duration=a.seconds, warmup=0)
                        after, n = _times(t.pids), len(r.samples)
                        cpu = " | ".join(f"user {(y[0] - x[0]) / n * 1e6:.0f} us + system {(y[1] - x[1]) / n * 1e6:.0f} us"
                                         for x, y in zip(before, after, strict=True))
                        print(f"{name:12} c={c:<3} {n} requests, {r.failures} failed: {cpu}", flush=True)
                        if a.strace:
                            table = d / f"strace-{name}-{c}.txt"
                            st = subprocess.Popen(["strace", "-c", "-f", "-o", str(table), "-p", str(t.pids[0])],
                                                  stderr=subprocess.DEVNULL)
                            await asyncio.sleep(0.5)  # strace attaches to every thread
                            r = await run_load(name, url, body, concurrency=c, requests=0, duration=a.seconds, warmup=0)
                            st.terminate()
                            st.wait(10)
                            print(f"{'':12} c={c:<3} system calls per request: {_syscalls(table, len(r.samples))}",
                                  flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--targets", type=lambda s: s.split(","), default=["motor-co", "motor", "vllm-router"])
    ap.add_argument("--conc", type=lambda s: [int(x) for x in s.split(",")], default=[1, 64])
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--strace", action="store_true")
    from motor_common.runner import install_uvloop

    install_uvloop()
    asyncio.run(main(ap.parse_args()))
