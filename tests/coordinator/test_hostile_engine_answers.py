"""An engine that answers with something no engine should send fails only its own request.

Real aiohttp servers stand in for hostile engines behind an in-process coordinator's gRPC API:
a redirect to another host (never followed: the answer must come from the engine the scheduler
chose), and answers the coordinator must hold whole (a prefill's answer, a non-streamed answer)
that are larger than ``engine_client.MAX_ANSWER_BYTES``, plain or as a small deflate body that
expands past it (read up to the bound, then refused).
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import grpc
import orjson
import pytest
from aiohttp import web

from motor_common.domain import Endpoint, EngineType, Instance, InstanceStatus, Role
from motor_common.grpc_server import error_reason
from motor_coordinator import engine_client
from tests.coordinator.grpc_util import Stubs
from tests.coordinator.test_decode_retry_sim import coordinator
from tests.coordinator.test_dispatch_sim import COMPLETIONS, MODEL

pytestmark = pytest.mark.slow

BODY = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
GOOD = {
    "id": "cmpl-1",
    "object": "text_completion",
    "model": MODEL,
    "choices": [{"index": 0, "text": "fine", "finish_reason": "length"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
}
BOUND = 1 << 20  # MAX_ANSWER_BYTES in these tests: 1 MiB


@asynccontextmanager
async def engine(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[tuple[int, list]]:
    """An engine serving *handler* on every path; yields (port, the bodies it received)."""
    got: list[bytes] = []

    async def recording(request: web.Request) -> web.StreamResponse:
        got.append(await request.read())
        return await handler(request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recording)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1], got  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


def inst(iid: int, role: Role, port: int) -> Instance:
    return Instance(
        iid,
        role,
        f"job-{iid}",
        MODEL,
        EngineType.VLLM,
        (Endpoint(0, "127.0.0.1", port),),
        InstanceStatus.AVAILABLE,
    )


async def good(request: web.Request) -> web.Response:
    return web.json_response(GOOD)


async def call(s: Stubs) -> tuple[int, bytes, str]:
    """(HTTP status of the head or 0, body bytes, "" or "CODE REASON")."""
    from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb

    status, chunks, error = 0, [], ""
    stream = s.dispatch.Dispatch(
        cpb.DispatchRequest(api=COMPLETIONS, body=orjson.dumps(BODY)), timeout=20
    )
    try:
        async for frame in stream:
            if frame.HasField("head"):
                status = frame.head.http_status
            else:
                chunks.append(frame.chunk)
    except grpc.aio.AioRpcError as exc:
        error = f"{exc.code().name} {error_reason(exc)}"
    return status, b"".join(chunks), error


async def test_a_redirect_from_an_engine_is_not_followed_and_the_request_goes_to_another_engine() -> (
    None
):
    async def thief(request: web.Request) -> web.Response:
        return web.json_response({"stolen": True})

    async with AsyncExitStack() as st:
        thief_port, stolen = await st.enter_async_context(engine(thief))

        async def redirect(request: web.Request) -> web.Response:
            raise web.HTTPTemporaryRedirect(
                f"http://localhost:{thief_port}/steal"
            )  # 307: the body too

        bad_port, _ = await st.enter_async_context(engine(redirect))
        good_port, answered = await st.enter_async_context(engine(good))
        _, s = await st.enter_async_context(coordinator())
        await s.set(inst(1, Role.UNION, bad_port), inst(2, Role.UNION, good_port))
        for _ in range(4):  # round robin: the redirecting engine is chosen first for half of them
            status, body, error = await call(s)
            assert (status, error) == (200, ""), (status, body, error)
            assert orjson.loads(body) == GOOD
        assert stolen == [], "the coordinator sent the request to the host the engine named"
        assert len(answered) == 4


async def test_a_redirect_from_the_only_engine_fails_the_request_with_union_failed() -> None:
    async with AsyncExitStack() as st:
        thief_port, stolen = await st.enter_async_context(engine(good))

        async def redirect(request: web.Request) -> web.Response:
            raise web.HTTPFound(f"http://localhost:{thief_port}/")

        port, _ = await st.enter_async_context(engine(redirect))
        _, s = await st.enter_async_context(coordinator(prefill_retries=0))
        await s.set(inst(1, Role.UNION, port))
        assert await call(s) == (0, b"", "UNAVAILABLE UNION_FAILED")
        assert stolen == []


def _huge_plain() -> web.Response:
    return web.json_response({"pad": "x" * (4 * BOUND)})


def _huge_deflated() -> web.Response:
    # a few KiB on the wire, 16 MiB once decompressed
    body = zlib.compress(b'{"pad":"' + b"x" * (16 * BOUND) + b'"}', 9)
    assert len(body) < BOUND // 16
    return web.Response(
        body=body, headers={"Content-Type": "application/json", "Content-Encoding": "deflate"}
    )


@pytest.mark.parametrize("shape", ["plain", "deflate"])
async def test_a_prefill_answer_past_the_bound_fails_the_request_and_nothing_reaches_the_decode(
    shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_client, "MAX_ANSWER_BYTES", BOUND)
    make = _huge_plain if shape == "plain" else _huge_deflated

    async def prefill(request: web.Request) -> web.Response:
        return make()

    async with AsyncExitStack() as st:
        p_port, _ = await st.enter_async_context(engine(prefill))
        d_port, decoded = await st.enter_async_context(engine(good))
        _, s = await st.enter_async_context(coordinator(prefill_retries=0))
        await s.set(inst(1, Role.PREFILL, p_port), inst(2, Role.DECODE, d_port))
        assert await call(s) == (0, b"", "UNAVAILABLE PREFILL_FAILED")
        assert decoded == []


@pytest.mark.parametrize("role", [Role.UNION, Role.DECODE])
@pytest.mark.parametrize("shape", ["plain", "deflate"])
async def test_a_whole_answer_past_the_bound_is_refused_as_response_too_large_and_the_next_request_is_served(
    shape: str, role: Role, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_client, "MAX_ANSWER_BYTES", BOUND)
    make = _huge_plain if shape == "plain" else _huge_deflated
    answers = [make, lambda: web.json_response(GOOD)]

    async def answering(request: web.Request) -> web.Response:
        return answers.pop(0)()

    async with AsyncExitStack() as st:
        port, _ = await st.enter_async_context(engine(answering))
        _, s = await st.enter_async_context(coordinator())
        if role is Role.UNION:
            await s.set(inst(1, Role.UNION, port))
        else:
            p_port, _ = await st.enter_async_context(engine(good))
            await s.set(inst(1, Role.PREFILL, p_port), inst(2, Role.DECODE, port))
        status, body, error = await call(s)
        assert (status, body, error) == (0, b"", "FAILED_PRECONDITION RESPONSE_TOO_LARGE"), (
            status,
            len(body),
            error,
        )
        # only that request failed: the same engine (not tripped as broken) serves the next one
        status, body, error = await call(s)
        assert (status, error) == (200, ""), (status, body, error)
        assert orjson.loads(body) == GOOD


async def test_a_precision_probe_answered_with_an_endless_stream_gives_no_answer_and_buffers_a_bounded_amount() -> (
    None
):
    """The probe asks for a JSON answer of a few tokens; an engine that streams without end gets
    it counted as no answer once it passes the bound, not held until the probe's timeout."""
    from motor_common.domain import EngineType as ET
    from motor_coordinator import precision_monitor
    from motor_coordinator.precision import ProbeGroup
    from motor_coordinator.precision_config import PrecisionPrompt

    sent = [0]

    async def endless_sse(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        event = b'data: {"choices":[{"index":0,"text":"' + b"x" * 65536 + b'"}]}\n\n'
        try:
            while True:
                await resp.write(event)
                sent[0] += len(event)
        except (ConnectionError, RuntimeError):
            return resp

    async with AsyncExitStack() as st:
        port, _ = await st.enter_async_context(engine(endless_sse))
        app, s = await st.enter_async_context(coordinator())
        union = inst(1, Role.UNION, port)
        await s.set(union)
        group = ProbeGroup(MODEL, ET.VLLM, union=app.state.instances[1])
        answer = await app.precision.probe(group, PrecisionPrompt(prompt="2+2=", expected="4"))
        assert answer is None
        assert (
            sent[0] < precision_monitor.MAX_ANSWER_BYTES + 32 * 2**20
        )  # what the socket buffers took besides
