"""Shared plumbing for the router benchmarks: engines, targets (direct, Motor, peer routers), CPU.

Not a test module. Processes are started with ``tests/procs.py`` (own session, log file, SIGTERM
then SIGKILL of the whole group). Peer routers come from ``.bench/routers-venv`` (created on
first use by ``scripts/routers-setup``: pinned vllm-router and sglang-router, shared with
``tests/conformance``).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import orjson
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.loadgen import Sample, one_request  # noqa: E402
from motor_common.ports import scan_free_port  # noqa: E402
from tests.conftest import tool  # noqa: E402
from tests.helpers import free_port  # noqa: E402
from tests.procs import Proc, running, start_coordinator, start_gateway, start_simulator  # noqa: E402

MODEL = "bench"
ROUTERS_VENV = ROOT / ".bench" / "routers-venv"
REALISTIC: tuple[str, ...] = ()  # the simulator's default cost model (2 ms + 0.05 ms/token prefill, 5 ms/token decode)
ZERO: tuple[str, ...] = ("--sim-zero-latency",)
T = TypeVar("T")


def ensure_routers_venv() -> Path:
    """``.bench/routers-venv`` with vllm-router and sglang-router (``scripts/routers-setup``:
    created once, ~220 MB; a no-op when its stamp is current)."""
    subprocess.run([str(ROOT / "scripts" / "routers-setup")], check=True)
    return ROUTERS_VENV


# --- engines ---------------------------------------------------------------------------------
@dataclass
class Engines:
    flavour: str  # vllm | sglang
    prefills: list[Proc]
    decodes: list[Proc]

    def endpoint_arg(self, sim: Proc) -> str:
        text = f"127.0.0.1:{sim.port}"
        if "bootstrap_port" in sim.extra:
            text += f",bootstrap={sim.extra['bootstrap_port']}"
        if "side_channel_port" in sim.extra:
            text += f",kv={sim.extra['side_channel_port']}"
        if "kv_events_port" in sim.extra:
            text += f",kv_events={sim.extra['kv_events_port']},kv_events_replay={sim.extra['kv_events_replay_port']}"
        return text


# A fleet's KV-event ports lie outside the kernel's ephemeral range: no free_port() pick (the
# engines' own HTTP, side-channel and bootstrap ports, another program's) and no outgoing connection
# can take one between its choice and the engine's bind. They are scanned from a random start in
# this range (two fleets on one machine rarely scan the same ports) and never repeat within a fleet.
KV_EVENTS_PORTS_FROM = (20000, 30000)
START_ATTEMPTS = 3  # a program (engine, router) whose port was taken anyway is started again with fresh ports
_IN_USE = re.compile(r"already in use|EADDRINUSE|os error 98", re.IGNORECASE)


def kv_event_ports(taken: set[int]) -> dict[str, int]:
    """An engine's KV-event publisher and replay ports (``Proc.extra`` keys), bindable now, outside
    the ephemeral range and not in *taken* (the fleet's ports so far), which they are added to."""
    ports: dict[str, int] = {}
    start = random.randrange(*KV_EVENTS_PORTS_FROM)
    for key in ("kv_events_port", "kv_events_replay_port"):
        ports[key] = start = scan_free_port("0.0.0.0", start, taken)  # the engine binds tcp://*
        taken.add(start)
    return ports


def port_taken(exc: BaseException) -> bool:
    """Whether a start-up failed because a port was taken before the program bound it (the
    program's log, which ``tests/procs.running`` puts in the error: "Address already in use")."""
    return isinstance(exc, (RuntimeError, TimeoutError)) and _IN_USE.search(str(exc)) is not None


async def start_until_bound(es: AsyncExitStack, name: str, start: Callable[[], AbstractAsyncContextManager[T]],
                            attempts: int = START_ATTEMPTS) -> T:
    """``start()`` entered on *es*; when it fails because a port was taken meanwhile, ``start()``
    again (it picks fresh ports on each call), at most *attempts* times, then a RuntimeError
    saying so. Any other failure is raised at once."""
    for attempt in range(1, attempts + 1):
        try:
            return await es.enter_async_context(start())
        except (RuntimeError, TimeoutError) as exc:
            if not port_taken(exc):
                raise
            if attempt == attempts:
                raise RuntimeError(
                    f"{name}: a port it was given was taken before it could bind it, {attempts} times with "
                    f"fresh ports each time (is something on this machine binding ports in bulk?); "
                    f"the last attempt: {exc}") from exc
            print(f"  {name}: a port was taken before it bound it; starting it again with fresh ports",
                  file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


def _kv_events_args(flavour: str, ports: dict[str, int]) -> list[str]:
    cfg: dict[str, Any] = {"publisher": "zmq", "endpoint": f"tcp://*:{ports['kv_events_port']}",
                           "replay_endpoint": f"tcp://*:{ports['kv_events_replay_port']}", "topic": "kv-events"}
    if flavour == "vllm":
        cfg["enable_kv_cache_events"] = True
    return ["--kv-events-config", json.dumps(cfg)]


@asynccontextmanager
async def start_engines(flavour: str, log_dir: Path, sim_args: Sequence[str], *, prefills: int = 1,
                        decodes: int = 1, prefill_args: Sequence[str] = (), decode_args: Sequence[str] = (),
                        kv_events: bool = False) -> AsyncIterator[Engines]:
    """*kv_events*: prefill engines publish KV-cache events (the engine's own ``--kv-events-config``
    on :func:`kv_event_ports`, in ``Proc.extra`` and announced by :meth:`Engines.endpoint_arg`).
    An engine that loses a port to another process before binding it is started again, alone
    (:func:`start_until_bound`)."""
    cap = ["--max-num-seqs", "512"] if flavour == "vllm" else ["--max-running-requests", "512"]
    taken: set[int] = set()

    @asynccontextmanager
    async def prefill(name: str) -> AsyncIterator[Proc]:
        ports = kv_event_ports(taken) if kv_events else {}
        events = _kv_events_args(flavour, ports) if kv_events else []
        async with start_simulator(flavour, "prefill", log_dir, model=MODEL, name=name,
                                   extra_args=[*cap, *sim_args, *prefill_args, *events]) as p:
            p.extra.update(ports)
            yield p

    def decode(name: str) -> AbstractAsyncContextManager[Proc]:
        return start_simulator(flavour, "decode", log_dir, model=MODEL, name=name,
                               extra_args=[*cap, *sim_args, *decode_args])

    async with AsyncExitStack() as es:
        ps = [await start_until_bound(es, f"{flavour}-p{i}", partial(prefill, f"{flavour}-p{i}"))
              for i in range(prefills)]
        ds = [await start_until_bound(es, f"{flavour}-d{i}", partial(decode, f"{flavour}-d{i}"))
              for i in range(decodes)]
        yield Engines(flavour, ps, ds)


# --- targets ---------------------------------------------------------------------------------
@dataclass
class Target:
    name: str
    url: str  # base URL the load generator posts to ("" for the direct client)
    pids: list[int] = field(default_factory=list)  # router process trees measured for CPU
    direct: Engines | None = None  # set for the direct (client-side hand-off) baseline
    metrics_url: str = ""  # Motor's coordinator /metrics, when its config sets server.metrics_port (0: any)

    def sender(self, timeout: float = 60.0) -> Any:
        if self.direct is None:
            return None
        engines = self.direct
        rr = {"p": 0, "d": 0}

        async def send(session: aiohttp.ClientSession, body: dict[str, Any]) -> Sample:
            p = engines.prefills[rr["p"] % len(engines.prefills)]
            d = engines.decodes[rr["d"] % len(engines.decodes)]
            rr["p"] += 1
            rr["d"] += 1
            return await direct_pd(session, engines.flavour, p, d, body, timeout)

        return send


def _vllm_prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    out = dict(body, stream=False, max_tokens=1)
    out["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                 "remote_block_ids": None, "remote_host": None, "remote_port": None}
    out.pop("stream_options", None)
    return out


async def direct_pd(session: aiohttp.ClientSession, flavour: str, p: Proc, d: Proc, body: dict[str, Any],
                    timeout: float) -> Sample:
    """The client does the PD hand-off itself (no router): the baseline every router is compared to.

    vLLM: prefill (max_tokens 1, ``do_remote_decode``) then decode with the returned
    ``kv_transfer_params``. SGLang: the same body with bootstrap host/port/room to P and D at once,
    D's answer returned."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    start = time.perf_counter()
    try:
        if flavour == "vllm":
            async with session.post(p.url + path, data=orjson.dumps(_vllm_prefill_body(body)),
                                    headers={"Content-Type": "application/json"},
                                    timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                reply = orjson.loads(await r.read())
                if r.status != 200:
                    return Sample(False, r.status, time.perf_counter() - start, error="prefill failed")
            dbody = dict(body, kv_transfer_params=reply.get("kv_transfer_params"))
            pre = time.perf_counter() - start
            s = await one_request(session, d.url + path, dbody, timeout=timeout)
        else:
            dbody = dict(body, bootstrap_host="127.0.0.1", bootstrap_port=p.extra["bootstrap_port"],
                         bootstrap_room=random.getrandbits(63))

            async def prefill() -> int:
                async with session.post(p.url + path, data=orjson.dumps(dbody),
                                        headers={"Content-Type": "application/json"},
                                        timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                    await r.read()
                    return r.status

            pre = 0.0
            pstatus, s = await asyncio.gather(prefill(), one_request(session, d.url + path, dbody, timeout=timeout))
            if pstatus != 200:
                s.ok = False
                s.error = f"prefill {pstatus}"
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        return Sample(False, 0, time.perf_counter() - start, error=f"{type(exc).__name__}: {exc}")
    s.latency = time.perf_counter() - start
    if s.ttft is not None:
        s.ttft += pre
    return s


def _http_ok(url: str, body: dict[str, Any] | None = None, timeout: float = 2.0) -> bool:
    try:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status) == 200
    except Exception:
        return False


def _serves_completions(port: int) -> Any:
    probe = {"model": MODEL, "prompt": "ready?", "max_tokens": 2}

    def ready(p: Proc) -> bool:
        p.port = port
        return _http_ok(p.url + "/v1/completions", probe)

    return ready


@asynccontextmanager
async def start_motor(engines: Engines, log_dir: Path, *, policy: str | None = None,
                      gateway_args: Sequence[str] = (), config: dict[str, Any] | None = None,
                      co_located: bool = False, gateway_config: dict[str, Any] | None = None,
                      name: str | None = None) -> AsyncIterator[Target]:
    """motor-coordinator + motor-gateway, engines registered with the real ``motor register add``;
    *co_located*: no gateway, the coordinator's own OpenAI front (``http.port``) is the target."""
    cfg = json.loads(json.dumps(config or {}))
    if policy:
        cfg.setdefault("scheduler", {})["policy"] = policy
    if co_located:
        cfg.setdefault("http", {})["port"] = 0
    async with AsyncExitStack() as es:
        coord = await es.enter_async_context(start_coordinator(log_dir, cfg))
        if co_located:
            gw = Proc("co-located", coord.popen, coord.log_path, port=int(coord.ports["http"]))
        else:
            gw = await es.enter_async_context(start_gateway(log_dir, [coord.address], extra_args=gateway_args,
                                                            config=gateway_config))
        env = {**os.environ, "MOTOR_COORDINATOR": coord.address}
        for role, sims in (("prefill", engines.prefills), ("decode", engines.decodes)):
            for sim in sims:
                proc = await asyncio.create_subprocess_exec(
                    tool("motor"), "register", "add", "--role", role, "--model", MODEL, "--engine",
                    engines.flavour, "--endpoint", engines.endpoint_arg(sim), env=env,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
                out, _ = await proc.communicate()
                if proc.returncode != 0:
                    raise RuntimeError(f"motor register add failed: {out.decode()}")
        deadline = time.monotonic() + 20
        probe = {"model": MODEL, "prompt": "ready?", "max_tokens": 2}
        while not await asyncio.to_thread(_http_ok, gw.url + "/v1/completions", probe):
            if time.monotonic() > deadline:
                raise TimeoutError(f"motor gateway not serving:\n{gw.log()[-2000:]}")
            await asyncio.sleep(0.1)
        metrics = coord.ports.get("metrics")  # the port it bound (server.metrics_port 0: the kernel's pick)
        yield Target(name or ("motor (co-located)" if co_located else "motor"), gw.url,
                     [coord.pid] if co_located else [coord.pid, gw.pid],
                     metrics_url=f"http://127.0.0.1:{metrics}/metrics" if metrics else "")


@asynccontextmanager
async def start_vllm_router(engines: Engines, log_dir: Path, policy: str) -> AsyncIterator[Target]:
    venv = ensure_routers_venv()

    def launch() -> AbstractAsyncContextManager[Proc]:  # fresh ports on every call
        port = free_port()
        # its Prometheus exporter's own port (default 29000: two routers at once, or another run's, clash)
        argv = [str(venv / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                "--vllm-pd-disaggregation", "--policy", policy]
        for p in engines.prefills:
            argv += ["--prefill", p.url]
        for d in engines.decodes:
            argv += ["--decode", d.url]
        return running(f"vllm-router-{policy}", argv, log_dir, ready=_serves_completions(port), deadline=60)

    async with AsyncExitStack() as es:
        proc = await start_until_bound(es, f"vllm-router-{policy}", launch)
        yield Target(f"vllm-router/{policy}", proc.url, [proc.pid])


@asynccontextmanager
async def start_sglang_router(engines: Engines, log_dir: Path, policy: str = "cache_aware"
                              ) -> AsyncIterator[Target]:
    venv = ensure_routers_venv()

    def launch() -> AbstractAsyncContextManager[Proc]:  # fresh ports on every call
        port = free_port()
        argv = [str(venv / "bin" / "python"), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                "--port", str(port), "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                "--pd-disaggregation", "--policy", policy]
        for p in engines.prefills:
            argv += ["--prefill", p.url, str(p.extra["bootstrap_port"])]
        for d in engines.decodes:
            argv += ["--decode", d.url]
        return running(f"sglang-router-{policy}", argv, log_dir, ready=_serves_completions(port), deadline=60)

    async with AsyncExitStack() as es:
        proc = await start_until_bound(es, f"sglang-router-{policy}", launch)
        yield Target(f"sglang-router/{policy}", proc.url, [proc.pid])


# --- CPU of a process tree -------------------------------------------------------------------
def tree_cpu(pids: Sequence[int]) -> float:
    """User+system CPU seconds of *pids* and all their descendants (live ones)."""
    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
    return total
