"""The gateway's DispatchMany stream (``multiplex``, on by default) against real processes: two
simulated vLLM engines, a real ``motor-coordinator``, and two real ``motor-gateway`` processes on
it — one multiplexing, one with ``multiplex: false`` (a Dispatch call per request). Both must give
clients the same bytes (non-streaming bodies, streamed chunks, error objects and statuses), and
the coordinator's own gRPC metrics show which RPC carried the traffic.

HA failover over the stream (a coordinator frozen or killed with requests open on it) is covered
by tests/ha/test_failover.py and tests/e2e/test_coordinator_restart_outage.py, whose gateways
multiplex by default; the fallback to Dispatch calls for a coordinator without DispatchMany by
test_a_coordinator_without_dispatch_many_gets_dispatch_calls below.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import pytest
import pytest_asyncio

from motor_gateway.config import GatewayConfig
from tests.e2e.test_standalone import register_engines
from tests.gateway.fakes import fake_coordinator, running_gateway
from tests.helpers import free_port, http_ok, wait_for
from tests.procs import Proc, start_coordinator, start_gateway, start_simulator

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180)]

MODEL = "tiny"
KEY = "multiplex-management-key"
_MASK = re.compile(rb'"(id|created|system_fingerprint)":\s*("[^"]*"|\d+|null)')


@dataclass
class Fleet:
    coordinator: Proc
    mux: Proc  # gateway, multiplex on (the default)
    unary: Proc  # gateway, multiplex: false
    logs: Path
    prefill: Proc
    decode: Proc

    async def metrics(self) -> str:
        async with aiohttp.ClientSession() as s, s.get(
                f"http://127.0.0.1:{self.coordinator.ports['metrics']}/metrics") as r:
            return await r.text()

    async def handled(self, method: str) -> float:
        """``motor_grpc_server_handled_total`` of the coordinator's DispatchService *method*."""
        total = 0.0
        for line in (await self.metrics()).splitlines():
            if (line.startswith("motor_grpc_server_handled_total{") and f'method="{method}"' in line
                    and "DispatchService" in line):
                total += float(line.rsplit(" ", 1)[1])
        return total


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Fleet]:
    logs = tmp_path_factory.mktemp("multiplex")
    async with AsyncExitStack() as es:
        prefill = await es.enter_async_context(start_simulator("vllm", "prefill", logs, model=MODEL))
        decode = await es.enter_async_context(start_simulator("vllm", "decode", logs, model=MODEL))
        coordinator = await es.enter_async_context(start_coordinator(
            logs, {"server": {"metrics_port": 0}}, management_key=KEY))
        (logs / "cli.key").write_text(KEY)
        await register_engines(coordinator.address, logs / "cli.key", MODEL, "vllm",
                               (("prefill", prefill), ("decode", decode)))
        mux = await es.enter_async_context(start_gateway(logs, [coordinator.address], name="gw-mux"))
        unary = await es.enter_async_context(start_gateway(
            logs, [coordinator.address], name="gw-unary", config={"multiplex": False}))
        for gw in (mux, unary):
            await wait_for(lambda gw=gw: http_ok(gw.url), timeout=30, what=f"{gw.name} ready")
        yield Fleet(coordinator, mux, unary, logs, prefill, decode)


async def _post(url: str, path: str, body: dict[str, object]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s, s.post(url + path, data=orjson.dumps(body),
                                                    headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.read()


async def _stream_chunks(url: str, body: dict[str, object]) -> list[bytes]:
    """The SSE events of a streamed answer, in order (ids and timestamps masked)."""
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200
        raw = await r.read()
    return [_MASK.sub(rb'"\1":"*"', e) for e in raw.split(b"\n\n") if e]


async def test_requests_travel_on_one_stream_and_dispatch_calls_only_without_multiplex(fleet: Fleet) -> None:
    dispatch_before = await fleet.handled("Dispatch")
    n = 12
    results = await asyncio.gather(*(_post(fleet.mux.url, "/v1/completions",
                                           {"model": MODEL, "prompt": f"hello {i}", "max_tokens": 3})
                                     for i in range(n)))
    assert [status for status, _ in results] == [200] * n
    assert all(orjson.loads(body)["choices"][0]["text"] for _, body in results)
    # Not one Dispatch call for those 12 requests: they went on the gateway's DispatchMany stream.
    assert await fleet.handled("Dispatch") == dispatch_before
    status, _ = await _post(fleet.unary.url, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2})
    assert status == 200
    await wait_for(lambda: _grew(fleet, "Dispatch", dispatch_before), timeout=10,
                   what="the multiplex: false gateway's Dispatch call counted")


async def _grew(fleet: Fleet, method: str, before: float) -> bool:
    return await fleet.handled(method) > before


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"model": MODEL, "prompt": "the same bytes", "max_tokens": 5, "temperature": 0}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    # errors: unknown model (coordinator NOT_FOUND), invalid body (coordinator INVALID_ARGUMENT)
    ("/v1/completions", {"model": "no-such-model", "prompt": "x", "max_tokens": 2}),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2, "kv_transfer_params": 7}),
])
async def test_answers_and_errors_are_byte_identical_with_and_without_multiplex(
        fleet: Fleet, path: str, body: dict[str, object]) -> None:
    got = await _post(fleet.mux.url, path, body)
    ref = await _post(fleet.unary.url, path, body)
    assert got[0] == ref[0]
    assert _MASK.sub(rb'"\1":"*"', got[1]) == _MASK.sub(rb'"\1":"*"', ref[1])
    if got[0] != 200:
        assert orjson.loads(got[1])["error"]["message"]


async def test_streamed_chunks_are_identical_with_and_without_multiplex(fleet: Fleet) -> None:
    body = {"model": MODEL, "prompt": "count", "max_tokens": 6, "temperature": 0, "stream": True}
    got = await _stream_chunks(fleet.mux.url, body)
    assert got == await _stream_chunks(fleet.unary.url, body)
    assert got[-1] == b"data: [DONE]" and len(got) >= 3


async def test_a_client_that_goes_away_mid_stream_stops_its_request_only(fleet: Fleet) -> None:
    """The cancel travels on the stream: the coordinator's in-flight count returns to 0, and the
    stream keeps serving the next requests."""
    body = {"model": MODEL, "prompt": "long", "max_tokens": 5000, "stream": True}
    async with aiohttp.ClientSession() as s:
        async with s.post(fleet.mux.url + "/v1/completions", json=body) as r:
            assert r.status == 200
            await r.content.readuntil(b"\n\n")  # the first event arrived: the request is running
            await wait_for(lambda: _in_flight(fleet, lambda v: v >= 1), timeout=10, what="request in flight")
        # the response closed here without reading the rest: the client went away
    await wait_for(lambda: _in_flight(fleet, lambda v: v == 0), timeout=20, what="request aborted")
    status, _ = await _post(fleet.mux.url, "/v1/completions", {"model": MODEL, "prompt": "after", "max_tokens": 2})
    assert status == 200


async def _in_flight(fleet: Fleet, ok: object) -> bool:
    total = 0.0
    for line in (await fleet.metrics()).splitlines():
        if line.startswith("motor_coordinator_requests_in_flight"):
            total += float(line.rsplit(" ", 1)[1])
    return bool(ok(total))  # type: ignore[operator]


async def test_a_coordinator_that_dies_fails_the_requests_open_on_the_stream_and_its_restart_gets_a_new_one(
        fleet: Fleet) -> None:
    logs = fleet.logs / "restart"
    port = free_port()
    args = ["--port", str(port)]
    async with AsyncExitStack() as es:
        coordinator = await es.enter_async_context(start_coordinator(
            logs, management_key=KEY, name="coord-restart", extra_args=args))
        await _register(coordinator, fleet)
        gateway = await es.enter_async_context(start_gateway(logs, [coordinator.address], name="gw-restart"))
        await wait_for(lambda: http_ok(gateway.url), timeout=30, what="gateway ready")
        body = {"model": MODEL, "prompt": "long", "max_tokens": 5000, "stream": True}
        async with aiohttp.ClientSession() as s, s.post(gateway.url + "/v1/completions", json=body) as r:
            assert r.status == 200
            await r.content.readuntil(b"\n\n")  # streaming on the DispatchMany stream
            coordinator.popen.kill()
            rest = await asyncio.wait_for(r.read(), 30)
        # The open request ends with the final SSE error event (the stream broke under it).
        assert b'data: {"error"' in rest, rest[-300:]
        status, answer = await _post(gateway.url, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1})
        assert status == 503, answer
        assert "coordinator is unreachable" in orjson.loads(answer)["error"]["message"]
        # The coordinator comes back on the same address (not registered yet): the next requests
        # open a new stream and get its own answer, REGISTRY_NOT_SYNCED.
        await es.enter_async_context(start_coordinator(logs, management_key=KEY, name="coord-restart-2",
                                                       extra_args=args))

        last: list[tuple[int, bytes]] = []

        async def not_synced() -> bool:
            last.append(await _post(gateway.url, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1}))
            status, answer = last[-1]
            # REGISTRY_NOT_SYNCED reads "cannot serve this request right now", not "unreachable"
            return status == 503 and b"cannot serve this request right now" in answer

        try:
            await wait_for(not_synced, timeout=30, what="the restarted coordinator's own answer")
        except TimeoutError:
            raise AssertionError(f"last answer: {last[-1]}") from None


async def _register(coordinator: Proc, fleet: Fleet) -> None:
    await register_engines(coordinator.address, fleet.logs / "cli.key", MODEL, "vllm",
                           (("prefill", fleet.prefill), ("decode", fleet.decode)))


async def test_a_coordinator_without_dispatch_many_gets_dispatch_calls(tmp_path: Path) -> None:
    """An older coordinator (no DispatchMany: UNIMPLEMENTED) is sent Dispatch calls, the first
    request included, and every later one without trying the stream again."""
    async with fake_coordinator() as (addr, fake), running_gateway(
            GatewayConfig(port=0, coordinators=(addr,)), tmp_path) as url:
        for i in range(3):
            status, body = await _post(url, "/v1/completions", {"model": "tiny", "prompt": f"p{i}"})
            assert (status, body) == (200, b'{"ok": true}')
        assert len(fake.requests) == 3
        assert [r.body for r in fake.requests] == [orjson.dumps({"model": "tiny", "prompt": f"p{i}"})
                                                   for i in range(3)]
