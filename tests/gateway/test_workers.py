"""``motor-gateway`` with ``workers: 2`` against real processes: four simulated vLLM engines
(2 prefill, 2 decode), a real ``motor-coordinator`` (policy ``prefix_aware``: prefill by prompt
prefix, decode by least load of its in-flight counts) and a real gateway whose supervisor runs two worker processes on
one port.

Which worker took a connection is read from the kernel (psutil: the worker process holding the
server side of the client's socket), so nothing in the gateway has to tell. What must hold:

* connections spread over the workers, and ``/metrics`` sums them whichever worker answers;
* the scheduling state is the coordinator's, so one worker's in-flight request steers another
  worker's next request to the other decode engine (least load), and a prompt prefix goes to the
  same prefill engine whichever worker took it;
* a worker killed (-9) or wedged (SIGSTOP: no heartbeat) is replaced, logged and counted, and the
  port keeps serving; SIGTERM to the parent drains the requests in flight on every worker;
* the admission limits are the whole front's: with two workers, ``max_in_flight_per_model: 2``
  lets two requests of the model through in total, not two per worker.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import psutil
import pytest
import pytest_asyncio

from tests.e2e.test_standalone import register_engines
from tests.helpers import wait_for
from tests.procs import Proc, start_coordinator, start_gateway, start_simulator

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(240)]

MODEL = "tiny"
KEY = "workers-management-key"


@dataclass
class Fleet:
    coordinator: Proc
    gateway: Proc
    logs: Path
    prefills: list[Proc]
    decodes: list[Proc]


def worker_pids(gateway: Proc) -> set[int]:
    return {c.pid for c in psutil.Process(gateway.pid).children() if c.is_running()}


def worker_holding(gateway: Proc, client_port: int) -> int | None:
    """The worker process whose socket is connected to the client's local *client_port*."""
    for child in psutil.Process(gateway.pid).children():
        try:
            for conn in child.net_connections(kind="tcp"):
                if conn.raddr and conn.raddr.port == client_port:
                    return int(child.pid)
        except psutil.NoSuchProcess:
            continue
    return None


def _own_ports(server_port: int) -> set[int]:
    """Local ports of this process's established connections to *server_port*."""
    return {c.laddr.port for c in psutil.Process().net_connections(kind="tcp")
            if c.raddr and c.raddr.port == server_port and c.status == psutil.CONN_ESTABLISHED}


class Client:
    """One client connection (a session with a single keep-alive connection) and the worker
    that accepted it."""

    def __init__(self, gateway: Proc) -> None:
        self.gateway = gateway
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1),
                                             timeout=aiohttp.ClientTimeout(total=60))
        self.worker: int | None = None

    async def connect(self) -> int:
        """Open the connection; the worker on its other end (the client's own new socket to the
        gateway's port is found by diffing this process's sockets)."""
        before = _own_ports(self.gateway.port)
        async with self.session.get(self.gateway.url + "/health") as r:
            assert r.status == 200
            await r.read()
        (port,) = _own_ports(self.gateway.port) - before
        self.worker = await wait_for(lambda: worker_holding(self.gateway, port), timeout=10,
                                     what="the worker holding the connection")
        return self.worker

    async def complete(self, prompt: str, max_tokens: int = 4) -> dict[str, object]:
        async with self.session.post(self.gateway.url + "/v1/completions", json={
                "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}) as r:
            body = await r.read()
            assert r.status == 200, body
        return dict(orjson.loads(body))

    async def close(self) -> None:
        await self.session.close()


async def client_on(gateway: Proc, want: Callable[[int], bool], what: str) -> Client:
    """A new connection accepted by a worker for which *want(pid)* holds (the kernel picks the
    worker per connection, so new connections are opened until one lands right)."""

    async def attempt() -> Client | None:
        c = Client(gateway)
        if want(await c.connect()):
            return c
        await c.close()
        return None

    return await wait_for(attempt, timeout=60, interval=0, what=what)


async def sim_metric(sim: Proc, name: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(f"{sim.url}/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


async def served(sims: list[Proc]) -> list[float]:
    return [await sim_metric(s, "vllm:request_success_total") for s in sims]


async def gateway_metric(client: Client, name: str) -> float:
    async with client.session.get(client.gateway.url + "/metrics") as r:
        text = await r.text()
    """The sum of the samples of *name*: a metric name, or a name and the start of its labels."""
    prefixes = (name,) if "{" in name else (name + "{", name + " ")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefixes))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Fleet]:
    logs = tmp_path_factory.mktemp("workers")
    async with AsyncExitStack() as es:
        prefills = [await es.enter_async_context(start_simulator("vllm", "prefill", logs, model=MODEL, name=f"p{i}"))
                    for i in range(2)]
        decodes = [await es.enter_async_context(start_simulator("vllm", "decode", logs, model=MODEL, name=f"d{i}"))
                   for i in range(2)]
        coordinator = await es.enter_async_context(start_coordinator(
            logs, {"server": {"metrics_port": 0}, "scheduler": {"policy": "prefix_aware"},
                   # Load = the coordinator's own in-flight counts (what every worker's requests
                   # add to), not also the engines' scraped queues: a scrape taken while the other
                   # decode served a request would tie the two and make the choice round robin.
                   "dispatch": {"metrics_scrape_interval_sec": 0}}, management_key=KEY))
        (logs / "cli.key").write_text(KEY)
        await register_engines(coordinator.address, logs / "cli.key", MODEL, "vllm",
                               [*(("prefill", s) for s in prefills), *(("decode", s) for s in decodes)])
        gateway = await es.enter_async_context(start_gateway(logs, [coordinator.address], name="gw",
                                                             config={"workers": 2}))
        await wait_for(lambda: len(worker_pids(gateway)) == 2, timeout=30, what="two gateway workers")
        await wait_for(lambda: _all_ready(gateway), timeout=60, what="both workers ready")
        yield Fleet(coordinator, gateway, logs, prefills, decodes)


async def _all_ready(gateway: Proc) -> bool:
    """/ready answered 200 by a connection on each worker."""
    seen: set[int] = set()
    for _ in range(40):
        c = Client(gateway)
        try:
            pid = await c.connect()
            async with c.session.get(gateway.url + "/ready") as r:
                if r.status != 200:
                    return False
            seen.add(pid)
        finally:
            await c.close()
        if seen == worker_pids(gateway):
            return True
    return False


@asynccontextmanager
async def closing(*clients: Client) -> AsyncIterator[None]:
    try:
        yield
    finally:
        for c in clients:
            await c.close()


async def test_connections_spread_over_the_workers_and_metrics_sum_them(fleet: Fleet) -> None:
    name = 'motor_gateway_requests_total{route="/v1/completions",status="200"'
    probe = Client(fleet.gateway)
    async with closing(probe):
        await probe.connect()
        before = await gateway_metric(probe, name)
    clients = [Client(fleet.gateway) for _ in range(16)]
    async with closing(*clients):
        pids = [await c.connect() for c in clients]
        for i, c in enumerate(clients):
            assert (await c.complete(f"spread {i}"))["choices"]
        # 16 connections on 2 workers: both took some (all on one: probability 2^-15).
        assert set(pids) == worker_pids(fleet.gateway) and len(set(pids)) == 2
    # Whichever worker answers the scrape, the count is every worker's.
    a = await client_on(fleet.gateway, lambda pid: pid == pids[0], "a connection on the first worker")
    b = await client_on(fleet.gateway, lambda pid: pid != pids[0], "a connection on the other worker")
    async with closing(a, b):
        assert await gateway_metric(a, name) == before + 16
        assert await gateway_metric(b, name) == before + 16
        assert await gateway_metric(a, "motor_gateway_workers") == 4  # configured 2 + running 2


async def test_least_load_sees_the_in_flight_request_of_another_worker(fleet: Fleet) -> None:
    a = await client_on(fleet.gateway, lambda _: True, "a connection")
    b = await client_on(fleet.gateway, lambda pid: pid != a.worker, "a connection on the other worker")
    async with closing(a, b):
        # Worker A holds a long streamed answer open on one decode engine.
        resp = await a.session.post(fleet.gateway.url + "/v1/completions", json={
            "model": MODEL, "prompt": "a long story", "max_tokens": 2000, "stream": True})
        assert resp.status == 200
        await resp.content.readline()  # the first event: decoding has started
        running = await wait_for(
            lambda: _running(fleet.decodes), timeout=20, what="the long stream running on one decode engine")
        busy = running.index(1.0)
        # Worker B's requests all go to the other decode engine: the coordinator counts A's.
        before = await served(fleet.decodes)
        for i in range(4):
            await b.complete(f"while busy {i}")
        after = await served(fleet.decodes)
        assert after[busy] == before[busy]
        assert after[1 - busy] == before[1 - busy] + 4
        resp.close()
    await wait_for(lambda: _running(fleet.decodes, total=0), timeout=30, what="the stream cancelled")


async def _running(decodes: list[Proc], total: float = 1.0) -> list[float] | None:
    counts = [await sim_metric(d, "vllm:num_requests_running") for d in decodes]
    return counts if sum(counts) == total else None


async def test_a_prefix_goes_to_the_same_prefill_engine_from_either_worker(fleet: Fleet) -> None:
    a = await client_on(fleet.gateway, lambda _: True, "a connection")
    b = await client_on(fleet.gateway, lambda pid: pid != a.worker, "a connection on the other worker")
    homes: set[int] = set()
    async with closing(a, b):
        for n in range(6):
            prompt = f"system prompt number {n}: " + "you are a helpful assistant. " * 8
            engines = []
            for client in (a, b, a, b):
                before = await served(fleet.prefills)
                await client.complete(prompt + f"question from {client.worker}")
                after = await served(fleet.prefills)
                moved = [i for i in range(2) if after[i] != before[i]]
                assert len(moved) == 1, (before, after)
                engines.append(moved[0])
            assert len(set(engines)) == 1, f"prefix {n} went to prefills {engines}"
            homes.add(engines[0])
    assert homes == {0, 1}, "6 prefixes all hashed to one prefill: the ring is not spreading"


async def test_a_killed_worker_is_restarted_and_the_port_keeps_serving(fleet: Fleet) -> None:
    old = worker_pids(fleet.gateway)
    victim = min(old)
    os.kill(victim, signal.SIGKILL)
    new = await wait_for(lambda: (lambda p: p if len(p) == 2 and victim not in p else None)(worker_pids(fleet.gateway)),
                         timeout=30, what="the killed worker replaced")
    assert len(new & old) == 1
    assert "gateway worker died; restarting it worker=" in fleet.gateway.log()
    assert f"pid={victim} code=-9 reason=exited" in fleet.gateway.log()
    # The replacement serves: a connection on it gets answers.
    (fresh,) = new - old
    c = await client_on(fleet.gateway, lambda pid: pid == fresh, "a connection on the new worker")
    async with closing(c):
        await wait_for(lambda: _ready_on(c), timeout=30, what="the new worker ready")
        assert (await c.complete("after the restart"))["choices"]
        assert await gateway_metric(c, 'motor_gateway_worker_restarts_total{reason="exited"') >= 1
        assert await gateway_metric(c, 'motor_gateway_workers{state="running"') == 2


async def _ready_on(c: Client) -> bool:
    async with c.session.get(c.gateway.url + "/ready") as r:
        return r.status == 200


async def _own_gateway(fleet: Fleet, es: AsyncExitStack, name: str, **config: object) -> Proc:
    gw = await es.enter_async_context(start_gateway(fleet.logs, [fleet.coordinator.address], name=name,
                                                    config={"workers": 2, **config}))
    await wait_for(lambda: len(worker_pids(gw)) == 2, timeout=30, what=f"{name}: two workers")
    await wait_for(lambda: _all_ready(gw), timeout=60, what=f"{name}: both workers ready")
    return gw


async def test_a_wedged_worker_is_killed_and_restarted(fleet: Fleet) -> None:
    async with AsyncExitStack() as es:
        gw = await _own_gateway(fleet, es, "gw-wedge", worker_liveness_timeout_sec=4)
        old = worker_pids(gw)
        victim = min(old)
        os.kill(victim, signal.SIGSTOP)  # alive, listening, but its event loop never runs
        try:
            await wait_for(lambda: victim not in worker_pids(gw) and len(worker_pids(gw)) == 2,
                           timeout=40, what="the wedged worker replaced")
        finally:
            if psutil.pid_exists(victim):
                os.kill(victim, signal.SIGCONT)
        assert "gateway worker unresponsive (no heartbeat); killing it worker=" in gw.log()
        assert f"pid={victim} code=-9 reason=unresponsive" in gw.log()
        await wait_for(lambda: _all_ready(gw), timeout=60, what="both workers ready again")
        c = await client_on(gw, lambda _: True, "a connection")
        async with closing(c):
            # the metric counts every kill the log shows (not "== 1": a healthy worker whose loop a
            # loaded box stalls past the 4 s liveness timeout is killed too, and counted)
            async def counted() -> bool:
                kills = gw.log().count("reason=unresponsive")
                metric = await gateway_metric(c, 'motor_gateway_worker_restarts_total{reason="unresponsive"')
                return kills >= 1 and metric == kills

            await wait_for(counted, timeout=10, what="every unresponsive kill in the log counted")


async def test_sigterm_drains_the_requests_of_every_worker(fleet: Fleet) -> None:
    async with AsyncExitStack() as es:
        gw = await _own_gateway(fleet, es, "gw-drain", shutdown_grace_sec=30)
        a = await client_on(gw, lambda _: True, "a connection")
        b = await client_on(gw, lambda pid: pid != a.worker, "a connection on the other worker")
        async with closing(a, b):
            streams = [await c.session.post(gw.url + "/v1/completions", json={
                "model": MODEL, "prompt": f"drain {i}", "max_tokens": 300, "stream": True})
                for i, c in enumerate((a, b))]
            for r in streams:
                assert r.status == 200
                await r.content.readline()
            gw.popen.send_signal(signal.SIGTERM)
            bodies = [await r.read() for r in streams]  # ~1.5 s of decode left on each
            for body in bodies:
                events = [e for e in body.split(b"\n\n") if e.strip()]
                assert events[-1] == b"data: [DONE]", events[-3:]
                assert b'"finish_reason":"length"' in body
        code = await asyncio.to_thread(gw.popen.wait, 60)
        assert code == 0, gw.log()[-3000:]
        assert "gateway stopping: draining every worker" in gw.log()



async def test_admission_limits_are_the_whole_fronts_not_per_worker(fleet: Fleet) -> None:
    async with AsyncExitStack() as es:
        gw = await _own_gateway(fleet, es, "gw-admission",
                                admission={"max_in_flight_per_model": 2, "max_queued_per_model": 0})
        first = await client_on(gw, lambda _: True, "a connection")
        clients = [first]
        for i in range(5):  # three connections on each worker
            on_first = sum(c.worker == first.worker for c in clients) < 3
            clients.append(await client_on(gw, lambda pid, f=on_first: (pid == first.worker) == f,
                                           f"connection {i + 2} on the chosen worker"))
        async with closing(*clients):
            assert {c.worker for c in clients} == worker_pids(gw)

            async def ask(c: Client) -> tuple[int, aiohttp.ClientResponse]:
                # A long stream (seconds of decode): an admitted one holds its slot until closed.
                r = await c.session.post(gw.url + "/v1/completions", json={
                    "model": MODEL, "prompt": "hold a slot", "max_tokens": 2000, "stream": True})
                if r.status == 200:
                    await r.content.readline()  # decoding has started
                else:
                    await r.read()
                return r.status, r

            answers = await asyncio.gather(*(ask(c) for c in clients))
            try:
                statuses = [status for status, _ in answers]
                # Each worker's share is 1: one stream per worker, the other four refused.
                assert sorted(statuses) == [200, 200, 429, 429, 429, 429], statuses
                assert {c.worker for c, s in zip(clients, statuses, strict=True) if s == 200} == worker_pids(gw)
                # The front's in-flight gauge (summed over the workers) says the same.
                probe = Client(gw)
                async with closing(probe):
                    assert await gateway_metric(probe, "motor_gateway_admission_in_flight") == 2
            finally:
                for _, r in answers:
                    r.close()
    await wait_for(lambda: _running(fleet.decodes, total=0), timeout=30, what="the streams cancelled")
