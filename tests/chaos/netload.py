"""The chaos load and a readiness probe as a process, for fleets inside a network namespace the
test process cannot reach (tests/chaos/test_partition.py runs it with ``ip netns exec``).

    python -m tests.chaos.netload probe --coordinator A --coordinator B --out readiness.jsonl
    python -m tests.chaos.netload load --gateway URL --model M --out outcomes.json --duration 50

``probe`` appends one JSON line per 100 ms: ``{"t": monotonic, "views": {address: [role, ready,
generation, available job names]}}`` (role 0, generation -1 when the coordinator did not answer
within 250 ms). ``load`` also keeps ``<out>.progress`` ("successes failures") up to date. ``load`` runs
:class:`tests.chaos.load.ClosedLoop` and writes every outcome as JSON when the duration is over or
on SIGTERM. Both stop on SIGTERM; both are bounded (``--duration``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
from dataclasses import asdict
from pathlib import Path

import grpc
import orjson

from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as kpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as kgrpc
from tests.chaos.load import ClosedLoop


async def _probe(addresses: list[str], key: str, out: Path, duration: float, stop: asyncio.Event) -> None:
    channels = {a: grpc.aio.insecure_channel(a) for a in addresses}
    stubs = {a: kgrpc.DispatchServiceStub(ch) for a, ch in channels.items()}
    registry = {a: kgrpc.InstanceRegistryServiceStub(ch) for a, ch in channels.items()}
    md = (("x-motor-management-key", key),)

    async def one(address: str) -> tuple[int, bool, int, list[str]]:
        """role, ready, registry generation, job names listed (generation -1: no answer)"""
        try:
            r = await stubs[address].GetReadiness(kpb.GetReadinessRequest(), timeout=0.25)
        except grpc.aio.AioRpcError:
            return 0, False, -1, []
        try:
            li = await registry[address].ListInstances(kpb.ListInstancesRequest(), metadata=md, timeout=0.25)
        except grpc.aio.AioRpcError:
            return int(r.role), bool(r.ready), -1, []
        jobs = [i.job_name for i in li.instances if i.status == tpb.INSTANCE_STATUS_AVAILABLE]
        return int(r.role), bool(r.ready), int(li.generation), jobs

    end = time.monotonic() + duration
    with open(out, "ab") as f:
        while not stop.is_set() and time.monotonic() < end:
            views = await asyncio.gather(*(one(a) for a in addresses))
            f.write(orjson.dumps({"t": time.monotonic(), "views": dict(zip(addresses, views, strict=True))}) + b"\n")
            f.flush()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)
    for ch in channels.values():
        await ch.close()


async def _load(gateway: str, model: str, out: Path, duration: float, stop: asyncio.Event) -> None:
    load = ClosedLoop([gateway], model, duration=duration)
    load.start()
    progress = out.with_suffix(".progress")
    end = time.monotonic() + duration
    while not stop.is_set() and time.monotonic() < end:
        progress.write_text(f"{len(load.succeeded())} {len(load.failures())}\n")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)
    await load.stop()
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(orjson.dumps({"started_at": load.started_at, "outcomes": [asdict(o) for o in load.outcomes]}))
    tmp.replace(out)


async def _main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if args.mode == "probe":
        key = Path(args.key_file).read_text().strip() if args.key_file else ""
        await _probe(args.coordinator, key, Path(args.out), args.duration, stop)
    else:
        await _load(args.gateway, args.model, Path(args.out), args.duration, stop)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["probe", "load"])
    ap.add_argument("--coordinator", action="append", default=[])
    ap.add_argument("--key-file", default="")
    ap.add_argument("--gateway", default="")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--out", required=True)
    ap.add_argument("--duration", type=float, default=60.0)
    asyncio.run(_main(ap.parse_args()))


if __name__ == "__main__":
    main()
