"""Profile motor-gateway and motor-coordinator under load with py-spy (not a test).

    .venv/bin/pip install py-spy      # a profiling tool, deliberately not a project dependency
    .venv/bin/python bench/profile_motor.py [--flavour vllm] [--stream] [--concurrency 16] [--seconds 6]
                                            [--co-located [--front-workers N]]

Starts zero-latency P and D simulators and Motor, drives load, records both processes with
``py-spy record --format raw`` and prints the top functions by own samples and by inclusive samples,
the own samples by where the code lives (Motor's packages, aiohttp, asyncio/uvloop, ...), and the
samples by the innermost Motor function on their stack (what each piece of Motor's per-request work
costs with the library calls it makes: the view the per-request machinery is cut by).
``--co-located``: the coordinator's co-located front alone (no gateway); with ``--front-workers N``
(``http.workers: N``) the coordinator and each of its N worker processes are recorded (at c=1 one
worker takes every request: one keep-alive connection).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ZERO, start_engines, start_motor
from bench.loadgen import run_load
from bench.run import make_body_factory


def _area(frame: str) -> str:
    """Where the code of a py-spy frame ``func (path:line)`` lives."""
    path = frame[frame.find("(") + 1:frame.rfind(")")] if "(" in frame else frame
    for needle, name in (("motor_", "Motor's own packages"), ("aiohttp", "aiohttp"), ("grpc", "grpc"),
                         ("prometheus_client", "prometheus_client"), ("/logging/", "logging"),
                         ("asyncio", "asyncio / uvloop"), ("runners.py", "asyncio / uvloop")):
        if needle in path:
            return name
    return "other: " + path.rsplit("/", 1)[-1].split(":")[0]


def _innermost_motor(raw_frames: list[str], frames: list[str]) -> str:
    """The innermost frame of Motor's own packages (the leaf's own name when none: the event loop
    or a library callback, e.g. aiohttp's server)."""
    for raw, short in zip(reversed(raw_frames), reversed(frames), strict=False):
        if "motor_common/runner.py" in raw:  # the process's main(): the loop and libraries under it
            break
        if "motor_" in raw:
            return short.rsplit(":", 1)[0]
    return "(the event loop, or a library callback) " + frames[-1].rsplit(":", 1)[0]


def summarise(raw: Path, top: int) -> str:
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    by_area: collections.Counter[str] = collections.Counter()
    motor: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        count = int(n)
        frames = [f.split(" (")[0] + " " + f.split("/")[-1].rstrip(")") for f in stack.split(";") if f]
        total += count
        if frames:
            own[frames[-1]] += count
            by_area[_area(stack.split(";")[-1] if stack else "")] += count
            motor[_innermost_motor(stack.split(";"), frames)] += count
        for f in set(frames):
            incl[f] += count
    lines = [f"  total samples {total}", "  -- own --"]
    lines += [f"  {c / total:6.1%}  {f}" for f, c in own.most_common(top)]
    lines += ["  -- own, by where the code lives --"]
    lines += [f"  {c / total:6.1%}  {f}" for f, c in by_area.most_common(top)]
    lines += ["  -- by the innermost Motor function on the stack (its own work and what it calls outside Motor) --"]
    lines += [f"  {c / total:6.1%}  {f}" for f, c in motor.most_common(top)]
    lines += ["  -- inclusive --"]
    lines += [f"  {c / total:6.1%}  {f}" for f, c in incl.most_common(top)]
    return "\n".join(lines)


async def amain(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="motor-prof-") as tmp:
        d = Path(tmp)
        config = {"http": {"workers": args.front_workers}} if args.front_workers > 1 else None
        async with start_engines(args.flavour, d, ZERO) as engines, \
                start_motor(engines, d, gateway_args=args.gateway_args, co_located=args.co_located,
                            config=config) as target:
            names: tuple[str, ...] = ("coordinator",) if args.co_located else ("coordinator", "gateway")
            pids = list(target.pids)
            if args.front_workers > 1:
                kids = psutil.Process(target.pids[0]).children()
                names += tuple(f"worker{i}" for i in range(len(kids)))
                pids += [k.pid for k in kids]
            procs = [subprocess.Popen([str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(pid),
                                       "--duration", str(int(args.seconds)), "--rate", "500", "--format", "raw",
                                       "--nonblocking", "--output", str(d / f"{name}.txt")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
                     for name, pid in zip(names, pids, strict=True)]
            res = await run_load("motor", target.url + "/v1/completions", make_body_factory(args.stream),
                                 concurrency=args.concurrency, requests=0, duration=args.seconds + 1)
            print(res.summary())
            for p in procs:
                p.wait()
            for name in names:
                print(f"== {name}")
                print(summarise(d / f"{name}.txt", args.top))
                if args.keep:
                    Path(args.keep).mkdir(parents=True, exist_ok=True)
                    (Path(args.keep) / f"{name}.txt").write_bytes((d / f"{name}.txt").read_bytes())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flavour", default="vllm")
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--gateway-args", nargs="*", default=[])
    ap.add_argument("--co-located", action="store_true", help="profile the co-located front (no gateway)")
    ap.add_argument("--front-workers", type=int, default=1,
                    help="with --co-located: http.workers N, and record each worker too")
    ap.add_argument("--keep", help="copy py-spy's raw stacks (<process>.txt) into this directory")
    args = ap.parse_args()
    if args.front_workers > 1 and not args.co_located:
        ap.error("--front-workers needs --co-located")
    asyncio.run(amain(args))


if __name__ == "__main__":
    main()
