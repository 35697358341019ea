"""Checks shared by the two OpenAI fronts that run as worker processes on one port:
``motor-gateway --workers N`` (tests/gateway/test_workers.py) and the coordinator's co-located
front with ``http.workers: N`` (tests/coordinator/test_front_workers.py).

Which worker took a connection is read from the kernel (psutil: the child process holding the
server side of the client's socket), so nothing in the front has to tell. ``front`` is the
supervising process's :class:`Proc` with ``port`` = the front's HTTP port.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
import orjson
import psutil

from tests.helpers import wait_for
from tests.procs import Proc

MODEL = "tiny"


def worker_pids(front: Proc) -> set[int]:
    return {c.pid for c in psutil.Process(front.pid).children() if c.is_running()}


def worker_holding(front: Proc, client_port: int) -> int | None:
    """The worker process whose socket is connected to the client's local *client_port*."""
    for child in psutil.Process(front.pid).children():
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

    def __init__(self, front: Proc) -> None:
        self.gateway = front
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1),
                                             timeout=aiohttp.ClientTimeout(total=60))
        self.worker: int | None = None

    async def connect(self) -> int:
        """Open the connection; the worker on its other end (the client's own new socket to the
        front's port is found by diffing this process's sockets)."""
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


async def client_on(front: Proc, want: Callable[[int], bool], what: str) -> Client:
    """A new connection accepted by a worker for which *want(pid)* holds (the kernel picks the
    worker per connection, so new connections are opened until one lands right)."""

    async def attempt() -> Client | None:
        c = Client(front)
        if want(await c.connect()):
            return c
        await c.close()
        return None

    return await wait_for(attempt, timeout=60, interval=0, what=what)


async def two_clients(front: Proc) -> tuple[Client, Client]:
    """A connection on one worker and one on the other."""
    a = await client_on(front, lambda _: True, "a connection")
    b = await client_on(front, lambda pid: pid != a.worker, "a connection on the other worker")
    return a, b


async def sim_metric(sim: Proc, name: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(f"{sim.url}/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


async def served(sims: list[Proc]) -> list[float]:
    return [await sim_metric(s, "vllm:request_success_total") for s in sims]


async def front_metric(client: Client, name: str) -> float:
    """The sum of the samples of *name* on the front's /metrics (a metric name, or a name and the
    start of its labels), as the worker on *client*'s connection answers it."""
    async with client.session.get(client.gateway.url + "/metrics") as r:
        text = await r.text()
    prefixes = (name,) if "{" in name else (name + "{", name + " ")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefixes))


async def all_ready(front: Proc) -> bool:
    """/ready answered 200 by a connection on each worker."""
    seen: set[int] = set()
    for _ in range(40):
        c = Client(front)
        try:
            pid = await c.connect()
            async with c.session.get(front.url + "/ready") as r:
                if r.status != 200:
                    return False
            seen.add(pid)
        finally:
            await c.close()
        if seen == worker_pids(front):
            return True
    return False


async def ready_on(c: Client) -> bool:
    async with c.session.get(c.gateway.url + "/ready") as r:
        return r.status == 200


@asynccontextmanager
async def closing(*clients: Client) -> AsyncIterator[None]:
    try:
        yield
    finally:
        for c in clients:
            await c.close()


async def running(decodes: list[Proc], total: float = 1.0) -> list[float] | None:
    """The engines' running request counts, once they add up to *total*."""
    counts = [await sim_metric(d, "vllm:num_requests_running") for d in decodes]
    return counts if sum(counts) == total else None


# -- the scenarios ----------------------------------------------------------------------------

async def connections_spread_and_metrics_sum(front: Proc, workers_metric: str) -> None:
    """16 connections land on both workers; the request count on /metrics is the whole front's
    whichever worker answers, and *workers_metric* (the supervisor's gauge) says 2 + 2."""
    name = 'motor_gateway_requests_total{route="/v1/completions",status="200"'
    probe = Client(front)
    async with closing(probe):
        await probe.connect()
        before = await front_metric(probe, name)
    clients = [Client(front) for _ in range(16)]
    async with closing(*clients):
        pids = [await c.connect() for c in clients]
        for i, c in enumerate(clients):
            assert (await c.complete(f"spread {i}"))["choices"]
        # 16 connections on 2 workers: both took some (all on one: probability 2^-15).
        assert set(pids) == worker_pids(front) and len(set(pids)) == 2
    a = await client_on(front, lambda pid: pid == pids[0], "a connection on the first worker")
    b = await client_on(front, lambda pid: pid != pids[0], "a connection on the other worker")
    async with closing(a, b):
        assert await front_metric(a, name) == before + 16
        assert await front_metric(b, name) == before + 16
        assert await front_metric(a, workers_metric) == 4  # configured 2 + running 2


async def least_load_sees_another_workers_request(
    front: Proc, decodes: list[Proc], seen: Callable[[Client], Awaitable[object]] | None = None,
) -> None:
    """Worker A holds a long stream on one decode engine; every request of worker B then goes to
    the other decode. *seen(b)*: awaited before B's requests (a wait for B's view of A's load)."""
    a, b = await two_clients(front)
    async with closing(a, b):
        resp = await a.session.post(front.url + "/v1/completions", json={
            "model": MODEL, "prompt": "a long story", "max_tokens": 2000, "stream": True})
        assert resp.status == 200
        await resp.content.readline()  # the first event: decoding has started
        counts = await wait_for(lambda: running(decodes), timeout=20,
                                what="the long stream running on one decode engine")
        busy = counts.index(1.0)
        if seen is not None:
            await seen(b)
        before = await served(decodes)
        for i in range(4):
            await b.complete(f"while busy {i}")
        after = await served(decodes)
        assert after[busy] == before[busy]
        assert after[1 - busy] == before[1 - busy] + 4
        resp.close()
    await wait_for(lambda: running(decodes, total=0), timeout=30, what="the stream cancelled")


async def a_prefix_stays_on_one_prefill(front: Proc, prefills: list[Proc]) -> None:
    """Each prompt prefix goes to one prefill engine from either worker, and prefixes spread over
    both. At least 6 prefixes, more until both engines are homes (at most 24): where 6 land is
    decided by the engines' ports, which differ per run, so all 6 on one engine happened (about 1
    run in 32); 24 on one engine means the ring does not spread (about 1 in 8 million by chance)."""
    a, b = await two_clients(front)
    homes: set[int] = set()
    async with closing(a, b):
        for n in range(24):
            if n >= 6 and homes == {0, 1}:
                break
            prompt = f"system prompt number {n}: " + "you are a helpful assistant. " * 8
            engines = []
            for client in (a, b, a, b):
                before = await served(prefills)
                await client.complete(prompt + f"question from {client.worker}")
                after = await served(prefills)
                moved = [i for i in range(2) if after[i] != before[i]]
                assert len(moved) == 1, (before, after)
                engines.append(moved[0])
            assert len(set(engines)) == 1, f"prefix {n} went to prefills {engines}"
            homes.add(engines[0])
    assert homes == {0, 1}, "24 prefixes all hashed to one prefill: the ring is not spreading"


async def a_killed_worker_is_replaced(front: Proc, label: str, metric_prefix: str) -> None:
    """SIGKILL to a worker: replaced, logged ("<label> worker died"), counted, and it serves."""
    old = worker_pids(front)
    victim = min(old)
    os.kill(victim, signal.SIGKILL)
    new = await wait_for(lambda: (lambda p: p if len(p) == 2 and victim not in p else None)(worker_pids(front)),
                         timeout=30, what="the killed worker replaced")
    assert len(new & old) == 1
    assert f"{label} worker died; restarting it worker=" in front.log()
    assert f"pid={victim} code=-9 reason=exited" in front.log()
    (fresh,) = new - old
    c = await client_on(front, lambda pid: pid == fresh, "a connection on the new worker")
    async with closing(c):
        await wait_for(lambda: ready_on(c), timeout=30, what="the new worker ready")
        assert (await c.complete("after the restart"))["choices"]
        assert await front_metric(c, f'{metric_prefix}_worker_restarts_total{{reason="exited"') >= 1
        assert await front_metric(c, f'{metric_prefix}_workers{{state="running"') == 2


async def sigterm_drains_every_worker(front: Proc, label: str) -> None:
    """A long stream on each worker, then SIGTERM to the supervisor: both streams end complete
    and the process exits 0."""
    a, b = await two_clients(front)
    async with closing(a, b):
        streams = [await c.session.post(front.url + "/v1/completions", json={
            "model": MODEL, "prompt": f"drain {i}", "max_tokens": 300, "stream": True})
            for i, c in enumerate((a, b))]
        for r in streams:
            assert r.status == 200
            await r.content.readline()
        front.popen.send_signal(signal.SIGTERM)
        bodies = [await r.read() for r in streams]  # ~1.5 s of decode left on each
        for body in bodies:
            events = [e for e in body.split(b"\n\n") if e.strip()]
            assert events[-1] == b"data: [DONE]", events[-3:]
            assert b'"finish_reason":"length"' in body
    code = await asyncio.to_thread(front.popen.wait, 60)
    assert code == 0, front.log()[-3000:]
    assert f"{label} stopping: draining every worker" in front.log()
