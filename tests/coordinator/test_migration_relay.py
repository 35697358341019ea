"""A migratable stream (``dispatch.migration_budget`` > 0, the default) reaches the client byte for
byte as the engine sent it, however the engine frames its SSE events: CRLF or CR line ends, a last
event without its blank line, an event longer than the tracker holds back. A real aiohttp server
stands in for the engine behind an in-process coordinator, called over its gRPC API."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import grpc
import orjson
import pytest
import pytest_asyncio
from aiohttp import web

from motor_common.domain import Endpoint, EngineType, Instance, InstanceStatus, Role
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.grpc_server import error_reason
from motor_coordinator.migration import MAX_PENDING_EVENT_BYTES
from tests.coordinator.test_decode_retry_sim import coordinator
from tests.coordinator.test_dispatch_sim import COMPLETIONS, MODEL, dispatch


def _event(text: str, finish: str | None = None) -> bytes:
    return b"data: " + orjson.dumps({"id": "cmpl-1", "object": "text_completion", "created": 1, "model": MODEL,
                                     "choices": [{"index": 0, "text": text, "finish_reason": finish}]})


def _stream(sep: bytes, last_sep: bytes | None = None) -> list[bytes]:
    """A completions stream in the pieces the engine writes, its events ended by *sep* (the last
    one by *last_sep*); pieces split events and separators."""
    raw = b"".join(_event(f" t{i}", "length" if i == 5 else None) + sep for i in range(6))
    raw += b"data: [DONE]" + (sep if last_sep is None else last_sep)
    return [raw[i:i + 37] for i in range(0, len(raw), 37)]


STREAMS = {
    "crlf": _stream(b"\r\n\r\n"),
    "cr": _stream(b"\r\r"),
    "mixed": _stream(b"\n\r\n"),
    "last event without its blank line": _stream(b"\n\n", last_sep=b""),
    # one event longer than the tracker holds back, then ordinary ones
    "oversized event": [b"data: " + b"x" * (MAX_PENDING_EVENT_BYTES + 1024) + b"\n\n", *_stream(b"\n\n")],
}
BREAK = b"the engine drops the connection here"


@pytest_asyncio.fixture
async def engine() -> AsyncIterator[tuple[int, list[list[bytes]]]]:
    """A union engine that answers each completions request with the next stream of the list the
    fixture yields (the test appends to it)."""
    answers: list[list[bytes]] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        pieces = answers.pop(0)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for piece in pieces:
            if piece == BREAK:
                assert request.transport is not None
                request.transport.close()  # no end of the chunked body: the stream broke
                return resp
            await resp.write(piece)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield port, answers
    assert not answers, "a stream was not asked for"
    await runner.cleanup()


def _union(port: int) -> Instance:
    return Instance(1, Role.UNION, "job-1", MODEL, EngineType.VLLM, (Endpoint(0, "127.0.0.1", port),),
                    InstanceStatus.AVAILABLE)


@pytest.mark.parametrize("framing", list(STREAMS))
async def test_the_client_gets_the_engines_stream_byte_for_byte(
    engine: tuple[int, list[list[bytes]]], framing: str,
) -> None:
    port, answers = engine
    async with AsyncExitStack() as st:
        _, s = await st.enter_async_context(coordinator())  # migration_budget: the default (1)
        await s.set(_union(port))
        answers.append(STREAMS[framing])
        head, raw = await dispatch(s, COMPLETIONS, {"model": MODEL, "prompt": "p", "max_tokens": 6, "stream": True})
        assert head.http_status == 200
        assert raw == b"".join(STREAMS[framing])  # was b"" for CRLF and CR framing


async def test_a_stream_relayed_untracked_is_not_continued_when_its_engine_breaks_it(
    engine: tuple[int, list[list[bytes]]],
) -> None:
    """Past the bound the client has bytes the tracker did not read: a continuation could repeat or
    skip text, so the break ends the call as a broken stream, with every byte sent so far."""
    port, answers = engine
    sent = [*_stream(b"\n\n")[:2], b"data: " + b"x" * (MAX_PENDING_EVENT_BYTES + 1024)]
    answers.append([*sent, BREAK])
    async with AsyncExitStack() as st:
        _, s = await st.enter_async_context(coordinator())
        await s.set(_union(port))
        body = {"model": MODEL, "prompt": "p", "max_tokens": 6, "stream": True}
        got: list[bytes] = []
        with pytest.raises(grpc.aio.AioRpcError) as broken:
            async for frame in s.dispatch.Dispatch(cpb.DispatchRequest(api=COMPLETIONS, body=orjson.dumps(body)),
                                                   timeout=30):
                if not frame.HasField("head"):
                    got.append(frame.chunk)
        assert error_reason(broken.value) == "ENGINE_STREAM_BROKEN"
        assert b"".join(got) == b"".join(sent)
