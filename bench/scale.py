"""Coordinator at 1,000 registered instances: dispatch decision time (not a test).

    .venv/bin/python bench/scale.py [--instances 1000] [--seconds 3] [--no-e2e]

1. In process: ``Scheduler.route`` (+ the decode pick) over N instances (N/2 prefill, N/2 decode,
   one endpoint each, one model), per policy: µs per decision (median of 5 rounds of 100).
2. End to end: one prefill and one decode ``motor-sim`` listening on 0.0.0.0; N instances are
   registered (``motor register add --file``) at distinct loopback addresses 127.0.x.y of those two
   ports, so all of them are real and healthy (the coordinator probes every one each second).
   Added latency of Motor over direct at concurrency 1, with 2 and with N instances registered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import MODEL, ZERO, Engines, Target, start_engines, start_motor
from bench.loadgen import run_load
from bench.run import make_body_factory
from motor_common.domain import Endpoint, EngineType, Instance, Role
from motor_coordinator.config import SchedulerConfig
from motor_coordinator.policies import RequestInfo, make_policy
from motor_coordinator.registry import RegistryState
from motor_coordinator.scheduler import Scheduler
from tests.conftest import tool


def loopback(i: int) -> str:
    return f"127.0.{1 + i // 250}.{1 + i % 250}"


def in_process(n: int, rounds: int = 5, per_round: int = 100) -> dict[str, float]:
    out: dict[str, float] = {}
    insts = {}
    for i in range(n):
        role = Role.PREFILL if i % 2 == 0 else Role.DECODE
        insts[i + 1] = Instance(i + 1, role, f"job-{i}", MODEL, EngineType.VLLM,
                                (Endpoint(0, loopback(i), 8000 + i % 2),))
    from types import MappingProxyType

    state = RegistryState(1, MappingProxyType(insts))
    for policy in ("round_robin", "least_load", "prefix_aware"):
        sched = Scheduler(make_policy(SchedulerConfig(policy=policy)))
        sched.accept(state)
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for k in range(per_round):
                sched.route(RequestInfo(k, MODEL, f"system prompt {k % 7} and some user text"))
            times.append((time.perf_counter() - t0) / per_round * 1e6)
        out[policy] = round(statistics.median(times), 1)
    return out


async def e2e(n: int, seconds: float) -> dict[str, float]:
    res: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="motor-scale-") as tmp:
        d = Path(tmp)
        async with start_engines("vllm", d, (*ZERO, "--host", "0.0.0.0")) as engines:
            direct = Target("direct", "", [], engines)
            body = make_body_factory(False)
            r = await run_load("direct", "", body, concurrency=1, requests=0, duration=seconds, send=direct.sender())
            res["direct_p50_ms"] = round(r.latency(50) * 1e3, 3)
            async with start_motor(engines, d) as motor:
                r = await run_load("motor", motor.url + "/v1/completions", body, concurrency=1, requests=0,
                                   duration=seconds)
                res["motor_2_instances_p50_ms"] = round(r.latency(50) * 1e3, 3)
                spec = {"instances": [
                    {"role": "prefill" if i % 2 == 0 else "decode", "model": MODEL, "engine": "vllm",
                     "endpoints": [endpoint(engines, i)], "job": f"scale-{i}"} for i in range(n - 2)]}
                (d / "scale.json").write_text(json.dumps(spec))
                coord = f"127.0.0.1:{_coord_port(d)}"
                t0 = time.perf_counter()
                proc = await asyncio.create_subprocess_exec(
                    tool("motor"), "register", "add", "--file", str(d / "scale.json"), "--no-health-check",
                    env={**os.environ, "MOTOR_COORDINATOR": coord}, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT)
                out, _ = await proc.communicate()
                if proc.returncode != 0:
                    raise RuntimeError(out.decode()[-2000:])
                res["register_s"] = round(time.perf_counter() - t0, 2)
                await asyncio.sleep(2.5)  # a couple of probe rounds over all endpoints
                r = await run_load("motor", motor.url + "/v1/completions", body, concurrency=1, requests=0,
                                   duration=seconds)
                res[f"motor_{n}_instances_p50_ms"] = round(r.latency(50) * 1e3, 3)
                res[f"motor_{n}_failures"] = r.failures
                r = await run_load("motor", motor.url + "/v1/completions", body, concurrency=64, requests=0,
                                   duration=seconds)
                res[f"motor_{n}_c64_rps"] = round(r.rps, 1)
    res["added_2_ms"] = round(res["motor_2_instances_p50_ms"] - res["direct_p50_ms"], 3)
    res[f"added_{n}_ms"] = round(res[f"motor_{n}_instances_p50_ms"] - res["direct_p50_ms"], 3)
    return res


def endpoint(engines: Engines, i: int) -> str:
    sim = engines.prefills[0] if i % 2 == 0 else engines.decodes[0]
    return f"{loopback(i)}:{sim.port},kv={sim.extra['side_channel_port']}"


def _coord_port(d: Path) -> int:
    return int(json.loads((d / "coordinator.ports.json").read_text())["grpc"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--no-e2e", action="store_true")
    args = ap.parse_args()
    print(f"route() µs per decision with {args.instances} instances:", in_process(args.instances), flush=True)
    print("route() µs per decision with 2 instances:", in_process(2), flush=True)
    if not args.no_e2e:
        print("end to end (concurrency 1, zero-latency engines):", asyncio.run(e2e(args.instances, args.seconds)))


if __name__ == "__main__":
    main()
