"""Per-request flow control on the gateway's DispatchMany stream, against real processes: two
zero-latency simulated vLLM engines (an ~18 MB streamed answer in about a second), a real
``motor-coordinator`` and a real ``motor-gateway``.

A client that stops reading a large streamed answer must not make the gateway buffer it: the
coordinator holds the request to its window (``DispatchStart.window_bytes``) and stops reading the
engine. Without it the gateway queued everything the kernel's socket buffers did not hold (many
megabytes). Meanwhile other requests on the same stream are served, and once the slow client
reads again it gets the whole answer, equal to a fast reader's.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass

import aiohttp
import orjson
import pytest
import pytest_asyncio

from motor_gateway.mux import WINDOW_BYTES
from tests.e2e.test_standalone import register_engines
from tests.helpers import http_ok, wait_for
from tests.procs import Proc, start_coordinator, start_gateway, start_simulator

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180)]

MODEL = "tiny"
KEY = "flow-control-management-key"
SIM_ARGS = ("--sim-zero-latency", "--max-model-len", "100000")
# ~18 MB of SSE (20,000 steps of 2 choices with 5 logprobs each).
BIG = {"model": MODEL, "prompt": "a long answer", "max_tokens": 20000, "n": 2, "logprobs": 5,
       "temperature": 0, "stream": True}
# What the gateway may hold for the stalled request: its window, plus the frame that may overdraw
# it (one engine read, well under this), plus a small request's frames.
BOUND = WINDOW_BYTES + 512 * 1024
_MASK = re.compile(rb'"(id|created|system_fingerprint)":\s*("[^"]*"|\d+|null)')


@dataclass
class Fleet:
    coordinator: Proc
    gateway: Proc


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Fleet]:
    logs = tmp_path_factory.mktemp("flow-control")
    async with AsyncExitStack() as es:
        prefill = await es.enter_async_context(start_simulator("vllm", "prefill", logs, model=MODEL,
                                                               extra_args=SIM_ARGS))
        decode = await es.enter_async_context(start_simulator("vllm", "decode", logs, model=MODEL,
                                                              extra_args=SIM_ARGS))
        coordinator = await es.enter_async_context(start_coordinator(
            logs, {"server": {"metrics_port": 0}}, management_key=KEY))
        (logs / "cli.key").write_text(KEY)
        await register_engines(coordinator.address, logs / "cli.key", MODEL, "vllm",
                               (("prefill", prefill), ("decode", decode)))
        gateway = await es.enter_async_context(start_gateway(logs, [coordinator.address]))
        await wait_for(lambda: http_ok(gateway.url), timeout=30, what="gateway ready")
        yield Fleet(coordinator, gateway)


async def _gauge(url: str, name: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " ")
               or line.startswith(name + "{"))


async def _buffered(fleet: Fleet) -> float:
    return await _gauge(fleet.gateway.url, "motor_gateway_dispatch_buffered_bytes")


async def _in_flight(fleet: Fleet) -> float:
    return await _gauge(f"http://127.0.0.1:{fleet.coordinator.ports['metrics']}",
                        "motor_coordinator_requests_in_flight")


class SlowClient:
    """An HTTP/1.1 client on a socket with a small receive buffer that reads only when told."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def post(cls, url: str, path: str, body: dict[str, object]) -> SlowClient:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        reader, writer = await asyncio.open_connection(sock=sock, limit=16 * 1024)
        data = orjson.dumps(body)
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
        await writer.drain()
        return cls(reader, writer)

    async def head(self) -> bytes:
        return await self.reader.readuntil(b"\r\n\r\n")

    async def chunked_body(self) -> bytes:
        """The rest of a chunked body, read as fast as it comes."""
        out = bytearray()
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).strip().split(b";")[0], 16)
            if size == 0:
                await self.reader.readuntil(b"\r\n")
                return bytes(out)
            out += await self.reader.readexactly(size)
            await self.reader.readexactly(2)

    def close(self) -> None:
        self.writer.close()


def _events(raw: bytes) -> list[bytes]:
    return [_MASK.sub(rb'"\1":"*"', e) for e in raw.split(b"\n\n") if e]


async def test_a_slow_reader_is_held_to_its_window_and_others_are_served(fleet: Fleet) -> None:
    async with aiohttp.ClientSession() as s, s.post(fleet.gateway.url + "/v1/completions", json=BIG) as r:
        assert r.status == 200
        fast = await r.read()
    assert len(fast) > 10 * 1024 * 1024 and fast.endswith(b"data: [DONE]\n\n")

    slow = await SlowClient.post(fleet.gateway.url, "/v1/completions", BIG)
    try:
        head = await asyncio.wait_for(slow.head(), 30)
        assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head.lower()
        # The client reads nothing more. The gateway fills what its window allows, then holds.
        seen: list[float] = []

        async def filled() -> bool:
            seen.append(await _buffered(fleet))
            return seen[-1] >= WINDOW_BYTES // 2

        await wait_for(filled, timeout=30, what="the stalled request's window filled in the gateway")
        assert max(seen) <= BOUND, seen
        # The engine's answer is not finished (the coordinator stopped reading it) ...
        assert await _in_flight(fleet) >= 1
        # ... and other requests on the same DispatchMany stream are served meanwhile.
        for i in range(3):
            async with aiohttp.ClientSession() as s, s.post(fleet.gateway.url + "/v1/completions", json={
                    "model": MODEL, "prompt": f"meanwhile {i}", "max_tokens": 4}) as r:
                answer = await r.read()
                assert r.status == 200, (r.status, answer)
                assert orjson.loads(answer)["choices"][0]["text"]
        assert await _buffered(fleet) <= BOUND
        # Reading again: the whole answer arrives, event for event the fast reader's.
        body = await asyncio.wait_for(slow.chunked_body(), 60)
    finally:
        slow.close()
    assert _events(body) == _events(fast)
    await wait_for(lambda: _drained(fleet), timeout=20, what="nothing left queued in the gateway")


async def _drained(fleet: Fleet) -> bool:
    return await _buffered(fleet) == 0 and await _in_flight(fleet) == 0
