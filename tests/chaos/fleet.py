"""A `motor up` fleet under chaos: every process it ever ran, what its coordinators listed, and
whether it is fully ready again.

* :class:`ProcessLedger` samples the process tree of `motor up` (and of any extra program the test
  started) every 100 ms and remembers every pid and process group it saw, so that after the fleet
  stopped the test can assert that none of them is left — an engine re-parented to init included.
* :class:`InstanceWatcher` asks every coordinator ``ListInstances`` every 100 ms during the
  scenario; an instance that was healthy throughout must be listed, available, in every answer of
  an authoritative registry (generation > 0; a coordinator that just restarted knows nothing until
  the controller's first SET, which is not a loss).
* :class:`ChaosFleet` finds programs and engines, kills or freezes them, and answers "fully ready":
  every program `motor up` supervises is running, the controller has every instance ACTIVE, the
  master coordinator lists every instance available, and every gateway's ``/health`` is 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import psutil
import yaml

from motor_cli.status import fetch_view
from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as kpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as kgrpc
from motor_common.grpc_client import call_metadata, open_channel
from tests.helpers import wait_for
from tests.motor_up import UpFleet, motor_up
from tests.procs import Proc, start_gateway

AVAILABLE = tpb.INSTANCE_STATUS_AVAILABLE


# --- processes -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Seen:
    pid: int
    created: float
    pgid: int
    cmd: str


@dataclass
class ProcessLedger:
    """Every process (and process group) seen under the given roots."""

    roots: list[int] = field(default_factory=list)
    seen: dict[tuple[int, float], Seen] = field(default_factory=dict)
    pgids: set[int] = field(default_factory=set)

    def sample(self) -> None:
        for root in list(self.roots):
            try:
                top = psutil.Process(root)
                procs = [top, *top.children(recursive=True)]
            except psutil.Error:
                continue
            for p in procs:
                try:
                    key = (p.pid, p.create_time())
                    if key not in self.seen:
                        pgid = os.getpgid(p.pid)
                        self.seen[key] = Seen(p.pid, key[1], pgid, " ".join(p.cmdline())[:200])
                        self.pgids.add(pgid)
                except (psutil.Error, ProcessLookupError):
                    continue

    async def run(self) -> None:
        while True:
            await asyncio.to_thread(self.sample)
            await asyncio.sleep(0.1)

    def alive(self) -> list[Seen]:
        """Processes seen that still exist (same pid *and* start time), or any member of a
        process group seen (a child started between two samples)."""
        left: dict[int, Seen] = {}
        for s in self.seen.values():
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(s.pid)
                if p.create_time() == s.created and p.status() != psutil.STATUS_ZOMBIE:
                    left[s.pid] = s
        for p in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if p.pid not in left and os.getpgid(p.pid) in self.pgids and p.status() != psutil.STATUS_ZOMBIE:
                    left[p.pid] = Seen(p.pid, p.create_time(), os.getpgid(p.pid), " ".join(p.cmdline())[:200])
        return list(left.values())

    def kill_leftovers(self) -> None:
        for s in self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(s.pid, signal.SIGCONT)
                os.kill(s.pid, signal.SIGKILL)


# --- coordinators' view ----------------------------------------------------------------------------
@dataclass
class Listing:
    t: float
    address: str
    generation: int
    instances: dict[str, int]  # job name -> status


@dataclass
class InstanceWatcher:
    addresses: list[str]
    key: str
    listings: list[Listing] = field(default_factory=list)
    errors: int = 0

    async def run(self) -> None:
        md = call_metadata(self.key)
        channels = {a: open_channel(a) for a in self.addresses}
        try:
            stubs = {a: kgrpc.InstanceRegistryServiceStub(ch) for a, ch in channels.items()}
            while True:
                await asyncio.gather(*(self._one(a, s, md) for a, s in stubs.items()))
                await asyncio.sleep(0.1)
        finally:
            for ch in channels.values():
                await ch.close()

    async def _one(self, address: str, stub: Any, md: Any) -> None:
        try:
            resp = await stub.ListInstances(kpb.ListInstancesRequest(page_size=1000), metadata=md, timeout=0.5)
        except grpc.aio.AioRpcError:
            self.errors += 1
            return
        self.listings.append(Listing(time.monotonic(), address, resp.generation,
                                     {i.job_name: i.status for i in resp.instances}))

    def lost(self, jobs: list[str]) -> list[str]:
        """(time, coordinator, job) of each authoritative listing that lacks one of *jobs* or shows
        it not available."""
        out = []
        for li in self.listings:
            if li.generation == 0:
                continue
            for job in jobs:
                status = li.instances.get(job)
                if status != AVAILABLE:
                    what = "missing" if status is None else tpb.InstanceStatus.Name(status)
                    out.append(f"{li.address} gen {li.generation}: {job} {what}")
        return out


# --- the fleet -------------------------------------------------------------------------------------
@dataclass
class ChaosFleet:
    up: UpFleet
    nodes: list[str]  # node (job) names, e.g. prefill-0
    ledger: ProcessLedger
    extra_gateways: list[Proc] = field(default_factory=list)

    @property
    def key(self) -> str:
        return Path(self.up.info["management_key_file"]).read_text().strip()

    @property
    def gateway_urls(self) -> list[str]:
        return [self.up.info["gateway_url"], *(g.url for g in self.extra_gateways)]

    @property
    def coordinators(self) -> list[str]:
        return list(self.up.info["coordinators"])

    @property
    def model(self) -> str:
        return str(self.up.info["model"])

    def program(self, name: str) -> dict[str, Any]:
        return dict(self.up.info["programs"][name])

    def pid(self, name: str) -> int:
        return int(self.program(name)["pid"])

    def coordinator_name(self, address: str) -> str:
        port = int(address.rsplit(":", 1)[1])
        return next(n for n, p in self.up.info["programs"].items() if p["kind"] == "coordinator" and p["port"] == port)

    def engine_pids(self, node: str) -> list[int]:
        """Engines (direct children) of a node's nodemanager."""
        try:
            return [c.pid for c in psutil.Process(self.pid(node)).children() if "motor-sim" in " ".join(c.cmdline())
                    or "motor_sim" in " ".join(c.cmdline())]
        except psutil.Error:
            return []

    def etcd_pid(self) -> int:
        """The etcd `motor up --ha` runs (a supervised program, or a child of motor up)."""
        for prog in self.up.info["programs"].values():
            if prog.get("kind") == "etcd" and prog.get("pid"):
                return int(prog["pid"])
        for child in psutil.Process(self.up.proc.pid).children():
            with contextlib.suppress(psutil.Error):
                if "etcd" in child.name():
                    return int(child.pid)
        raise AssertionError("no etcd process under motor up")

    def engine_port(self, node: str) -> int:
        """The HTTP port of *node*'s (first) engine, from its command line."""
        pid = self.engine_pids(node)[0]
        argv = psutil.Process(pid).cmdline()
        return int(argv[argv.index("--port") + 1])

    async def running_requests(self, node: str) -> int:
        """``vllm:num_requests_running`` of *node*'s engine (its /metrics)."""
        url = f"http://127.0.0.1:{self.engine_port(node)}/metrics"
        async with aiohttp.ClientSession() as http, http.get(url, timeout=aiohttp.ClientTimeout(total=1)) as r:
            text = await r.text()
        return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("vllm:num_requests_running")))

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Signal program *name* (its process only, as `kill -9 PID` does); returns its pid."""
        pid = self.pid(name)
        os.kill(pid, sig)
        return pid

    def signal_engine(self, node: str, sig: int) -> list[int]:
        """Signal the process group of every engine of *node*."""
        pids = self.engine_pids(node)
        assert pids, f"no engine process under {node}'s nodemanager"
        for pid in pids:
            os.killpg(os.getpgid(pid), sig)
        return pids

    async def kill_engine(self, node: str) -> float:
        """SIGKILL *node*'s engines; returns when, after the controller has seen the instance
        leave ACTIVE (so "fully ready" afterwards means recovered, not "not yet noticed")."""
        at = time.monotonic()
        self.signal_engine(node, signal.SIGKILL)

        async def noticed() -> bool:
            view = await fetch_view(self.up.info["controller"], self.key, timeout=1.0)
            return any(i["job"] == node and i["state"] != "active" for i in view.instances)

        await wait_for(noticed, timeout=15, interval=0.02, what=f"the controller to notice {node}'s engine died")
        return at

    async def restarted(self, name: str, old_pid: int) -> bool:
        prog = self.up.info["programs"].get(name, {})
        pid = prog.get("pid")
        return bool(pid and pid != old_pid and psutil.pid_exists(pid))

    async def master(self) -> str:
        for address in self.coordinators:
            v = await readiness(address)
            if v is not None and v.ready and v.role in (kpb.COORDINATOR_ROLE_MASTER, kpb.COORDINATOR_ROLE_STANDALONE):
                return address
        return ""

    async def not_ready_reason(self) -> str:
        """'' when the fleet is fully ready, else what is not."""
        for name, prog in self.up.info["programs"].items():
            if not prog.get("pid") or not psutil.pid_exists(prog["pid"]):
                return f"{name} not running"
        view = await fetch_view(self.up.info["controller"], self.key, timeout=1.0)
        if not view.ok:
            return view.error
        if view.active != len(self.nodes):
            return f"controller: {view.active}/{len(self.nodes)} instances active"
        master = await self.master()
        if not master:
            return "no ready master coordinator"
        listing = await list_instances(master, self.key)
        if listing is None or any(listing.get(n) != AVAILABLE for n in self.nodes):
            return f"coordinator {master} lists {listing}"
        async with aiohttp.ClientSession() as http:
            for url in self.gateway_urls:
                try:
                    async with http.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=1)) as r:
                        if r.status != 200:
                            return f"gateway {url} /health {r.status}"
                except (TimeoutError, aiohttp.ClientError) as exc:
                    return f"gateway {url}: {type(exc).__name__}"
        return ""

    async def fully_ready(self) -> bool:
        return await self.not_ready_reason() == ""


async def readiness(address: str, timeout: float = 0.5) -> kpb.GetReadinessResponse | None:
    async with open_channel(address) as ch:
        try:
            r: kpb.GetReadinessResponse = await kgrpc.DispatchServiceStub(ch).GetReadiness(
                kpb.GetReadinessRequest(), timeout=timeout)
            return r
        except grpc.aio.AioRpcError:
            return None


async def list_instances(address: str, key: str) -> dict[str, int] | None:
    async with open_channel(address) as ch:
        try:
            resp = await kgrpc.InstanceRegistryServiceStub(ch).ListInstances(
                kpb.ListInstancesRequest(page_size=1000), metadata=call_metadata(key), timeout=1.0)
        except grpc.aio.AioRpcError:
            return None
    return {i.job_name: i.status for i in resp.instances}


# The one setting the suite adds to `motor up`'s defaults: the controller's fault manager on (engine
# relaunch in place), the mode in which a fleet is meant to ride out faults.
FLEET_CONFIG = {"controller": {"fault_tolerance_config": {"enable_fault_tolerance": True}}}


def node_names(prefill: int, decode: int) -> list[str]:
    return [*(f"prefill-{i}" for i in range(prefill)), *(f"decode-{i}" for i in range(decode))]


@asynccontextmanager
async def chaos_fleet(
    tmp_path: Path, *args: str, prefill: int = 2, decode: int = 2, gateways: int = 1, timeout: float = 60,
    coordinator: dict[str, Any] | None = None,
) -> AsyncIterator[ChaosFleet]:
    """``motor up --prefill P --decode D *args*`` (plus ``gateways - 1`` extra ``motor-gateway``
    processes on the same coordinators; *coordinator*: the coordinators' config section), fully
    ready, its processes recorded from the start."""
    ledger = ProcessLedger()
    config = tmp_path / "fleet-config.yaml"
    config.write_text(yaml.safe_dump({**FLEET_CONFIG, **({"coordinator": coordinator} if coordinator else {})}))
    async with AsyncExitStack() as es:
        up = await es.enter_async_context(motor_up(
            tmp_path, "--prefill", str(prefill), "--decode", str(decode), "--config", str(config), *args,
            timeout=timeout))
        ledger.roots.append(up.proc.pid)
        ledger.sample()
        fleet = ChaosFleet(up, node_names(prefill, decode), ledger)
        for i in range(1, gateways):
            gw = await es.enter_async_context(
                start_gateway(tmp_path / "extra", fleet.coordinators, name=f"gateway-extra-{i}",
                              # the coordinators take Dispatch only with an inference key
                              config={"coordinator_key_file": up.info["inference_key_file"]}))
            fleet.extra_gateways.append(gw)
            ledger.roots.append(gw.pid)
        sampler = asyncio.get_running_loop().create_task(ledger.run())
        es.callback(sampler.cancel)
        try:
            await wait_for(fleet.fully_ready, timeout=30, what="the fleet fully ready before the fault")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}: {await fleet.not_ready_reason()}\n{up.diagnostics()}") from None
        yield fleet

