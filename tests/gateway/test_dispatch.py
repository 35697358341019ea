"""The gateway relays OpenAI requests to the coordinator's DispatchService and maps its errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import orjson
import pytest

from motor_common import errors
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.openai_front import app
from motor_gateway.config import GatewayConfig
from tests.gateway.conftest import Rig
from tests.gateway.fakes import (
    chunk,
    failing,
    fake_coordinator,
    hanging,
    head,
    in_process_gateway,
    replay,
    running_gateway,
)

COMPLETION = {"model": "tiny", "prompt": "hello", "max_tokens": 4}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def assert_openai_error(body: dict[str, Any], kind: str) -> None:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == kind
    assert body["error"]["message"]


async def test_non_stream_body_and_head_status_are_relayed_unchanged(rig: Rig) -> None:
    payload = b'{"id":"cmpl-1","object":"text_completion","choices":[{"text":" world"}]}'
    rig.fake.script = replay(head(200, "application/json"), chunk(payload[:10]), chunk(payload[10:]))
    async with rig.http.post(f"{rig.url}/v1/completions", json=COMPLETION) as resp:
        assert resp.status == 200
        assert resp.content_type == "application/json"
        assert await resp.read() == payload
    req = rig.fake.requests[0]
    assert req.api == cpb.OPEN_AI_API_COMPLETIONS
    assert orjson.loads(req.body) == COMPLETION


async def test_engine_error_status_from_head_is_relayed(rig: Rig) -> None:
    payload = b'{"error":{"message":"max_tokens too large","type":"BadRequestError","param":null,"code":400}}'
    rig.fake.script = replay(head(400), chunk(payload))
    async with rig.http.post(f"{rig.url}/v1/completions", json=COMPLETION) as resp:
        assert resp.status == 400
        assert await resp.read() == payload


async def test_sse_chunks_are_relayed_byte_for_byte_as_they_arrive(rig: Rig) -> None:
    parts = [b'data: {"choices":[{"delta":{"content":"he', b'llo"}}]}\n\n', b"data: [DONE]\n\n"]
    gate = asyncio.Event()

    async def script(request: cpb.DispatchRequest, context: Any) -> Any:
        yield head(200, "text/event-stream")
        yield chunk(parts[0])
        await gate.wait()  # the first chunk must reach the client before the stream ends
        yield chunk(parts[1])
        yield chunk(parts[2])

    rig.fake.script = script
    async with rig.http.post(f"{rig.url}/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        first = await asyncio.wait_for(resp.content.readexactly(len(parts[0])), 5)
        assert first == parts[0]
        gate.set()
        rest = await resp.read()
    assert first + rest == b"".join(parts)
    assert rig.fake.requests[0].api == cpb.OPEN_AI_API_CHAT_COMPLETIONS


async def test_error_after_stream_started_is_a_final_sse_error_event(rig: Rig) -> None:
    rig.fake.script = failing(
        errors.Unavailable("decode instance died", reason="DECODE_FAILED"),
        head(200, "text/event-stream"),
        chunk(b'data: {"x":1}\n\n'),
    )
    async with rig.http.post(f"{rig.url}/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 200
        body = await resp.read()
    first, last = body.split(b"\n\n")[0:2]
    assert first == b'data: {"x":1}'
    assert last.startswith(b"data: ")
    event = orjson.loads(last[len(b"data: "):])
    assert_openai_error(event, "service_unavailable_error")
    # internals (which engine, why) stay in the log; the client gets an actionable message
    assert "decode instance died" not in event["error"]["message"]
    assert event["error"]["message"].startswith("the model's decode engines failed")
    assert event["error"]["code"] == "decode_failed"


@pytest.mark.parametrize(
    ("exc", "status", "kind"),
    [
        (errors.InvalidArgument("bad body", reason="INVALID_BODY"), 400, "invalid_request_error"),
        (errors.NotFound("model 'x' is not served", reason="MODEL_NOT_FOUND"), 404, "not_found_error"),
        (errors.Unavailable("no schedulable prefill instance for model 'tiny'", reason="NO_SCHEDULABLE_INSTANCE"),
         503, "service_unavailable_error"),
        (errors.Unavailable("engine 10.0.0.7:8001 unreachable: ClientConnectorError", reason="PREFILL_FAILED"),
         503, "service_unavailable_error"),
        (errors.Unavailable("the decode engine could not load the prefill's KV cache (3 attempt(s))",
                            reason="KV_TRANSFER_FAILED"), 503, "service_unavailable_error"),
        (errors.DeadlineExceeded("engine timed out"), 504, "timeout_error"),
        (errors.Internal("boom"), 500, "server_error"),
        (RuntimeError("unexpected"), 500, "server_error"),
    ],
)
async def test_coordinator_status_maps_to_http_status_and_openai_error(
    rig: Rig, exc: BaseException, status: int, kind: str
) -> None:
    rig.fake.script = failing(exc)
    async with rig.http.post(f"{rig.url}/v1/completions", json=COMPLETION,
                             headers={"X-Request-Id": "rid-err"}) as resp:
        assert resp.status == status
        assert resp.headers["X-Request-Id"] == "rid-err"
        body = await resp.json()
    assert_openai_error(body, kind)
    message = body["error"]["message"]
    if status < 500 or body["error"]["code"] == "no_schedulable_instance":
        assert message == exc.message  # written for the client
    else:  # internals replaced; the request id lets an operator find them in the log
        assert "rid-err" in message
        assert str(exc) not in message and "10.0.0.7" not in message and "Error" not in message


async def test_model_not_found_code_is_model_not_found(rig: Rig) -> None:
    rig.fake.script = failing(errors.NotFound("model 'x' is not served", reason="MODEL_NOT_FOUND"))
    async with rig.http.post(f"{rig.url}/v1/completions", json=COMPLETION) as resp:
        assert (await resp.json())["error"]["code"] == "model_not_found"


async def test_registry_not_synced_is_503_service_unavailable_with_retry_after(rig: Rig) -> None:
    rig.fake.script = failing(errors.Unavailable("instance set not received yet", reason="REGISTRY_NOT_SYNCED"))
    async with rig.http.post(f"{rig.url}/v1/completions", json=COMPLETION) as resp:
        assert resp.status == 503 and resp.headers["Retry-After"] == "1"
        body = await resp.json()
    assert body["error"]["code"] == "service_unavailable"
    assert "retry later" in body["error"]["message"]


async def test_dispatch_deadline_gives_504(tmp_path: Path) -> None:
    async with fake_coordinator() as (addr, fake):
        fake.script = hanging()
        cfg = GatewayConfig(coordinators=(addr,), request_timeout_sec=0.3)
        async with running_gateway(cfg, tmp_path) as url, aiohttp.ClientSession() as http:
            async with http.post(f"{url}/v1/completions", json=COMPLETION) as resp:
                assert resp.status == 504
                assert_openai_error(await resp.json(), "timeout_error")


async def test_in_process_dispatch_deadline_gives_504() -> None:
    async with in_process_gateway(request_timeout=0.3) as (url, fake), aiohttp.ClientSession() as http:
        fake.script = hanging()
        async with http.post(f"{url}/v1/completions", json=COMPLETION) as resp:
            assert resp.status == 504
            body = await resp.json()
        assert_openai_error(body, "timeout_error")
        await asyncio.wait_for(fake.cancelled.wait(), 5)


async def test_in_process_deadline_mid_stream_ends_the_stream_with_a_timeout_event() -> None:
    """The co-located front's one deadline timer per request: it fires while the handler waits for
    the next frame of a started stream (the client got the head and a chunk): a final SSE error
    event, the dispatch cancelled."""
    async with in_process_gateway(request_timeout=0.5) as (url, fake), aiohttp.ClientSession() as http:
        fake.script = hanging(head(200, "text/event-stream"), chunk(b'data: {"n":1}\n\n'))
        async with http.post(f"{url}/v1/completions", json={**COMPLETION, "stream": True}) as resp:
            assert resp.status == 200
            body = await asyncio.wait_for(resp.read(), 10)
        first, last = [e for e in body.split(b"\n\n") if e]
        assert first == b'data: {"n":1}'
        assert_openai_error(orjson.loads(last.removeprefix(b"data: ")), "timeout_error")
        await asyncio.wait_for(fake.cancelled.wait(), 5)


@pytest.mark.parametrize("code", [grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN])
async def test_a_call_broken_in_grpc_before_the_head_is_a_503_with_retry_after(
    tmp_path: Path, code: grpc.StatusCode
) -> None:
    """A coordinator killed while it held the call reaches the gateway as gRPC's own INTERNAL
    ("Internal error from Core") or UNKNOWN ("Stream removed"), without the ErrorInfo every
    coordinator error carries: the client gets 503 coordinator unreachable + Retry-After (SDKs
    back off and retry), as for a refused connection — not a 502. (gRPC transport only: the
    co-located front has no call to break.)"""
    async def script(request: cpb.DispatchRequest, context: Any) -> AsyncIterator[cpb.DispatchResponse]:
        await context.abort(code, "Internal error from Core")
        yield head()  # never reached

    async with fake_coordinator() as (addr, fake):
        fake.script = script
        cfg = GatewayConfig(coordinators=(addr,), request_timeout_sec=5.0)
        async with running_gateway(cfg, tmp_path) as url, aiohttp.ClientSession() as http, \
                http.post(f"{url}/v1/completions", json=COMPLETION) as resp:
            assert resp.status == 503 and int(resp.headers["Retry-After"]) >= 1
            body = await resp.json()
    assert_openai_error(body, "service_unavailable_error")
    assert body["error"]["code"] == "coordinator_unreachable", body


async def test_unreachable_coordinator_gives_503(tmp_path: Path) -> None:
    from tests.helpers import free_port

    cfg = GatewayConfig(coordinators=(f"127.0.0.1:{free_port()}",), request_timeout_sec=2, control_timeout_sec=1)
    async with running_gateway(cfg, tmp_path) as url, aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/completions", json=COMPLETION) as resp:
            assert resp.status == 503
            body = await resp.json()
        assert_openai_error(body, "service_unavailable_error")
        assert body["error"]["message"].startswith("the coordinator is unreachable; retry later")
        assert "127.0.0.1" not in body["error"]["message"]  # the address is in the log only


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", b"{not json", None),
        ("/v1/completions", b"[1, 2]", None),
        ("/v1/completions", b"", None),
        ("/v1/completions", orjson.dumps({"prompt": "x"}), "model"),
        ("/v1/completions", orjson.dumps({"model": "", "prompt": "x"}), "model"),
        ("/v1/completions", orjson.dumps({"model": 3, "prompt": "x"}), "model"),
        ("/v1/completions", orjson.dumps({"model": "tiny"}), "prompt"),
        ("/v1/completions", orjson.dumps({"model": "tiny", "prompt": "x", "stream": "yes"}), "stream"),
        ("/v1/chat/completions", orjson.dumps({"model": "tiny", "prompt": "x"}), "messages"),
        ("/v1/chat/completions", orjson.dumps({"model": "tiny", "messages": "hi"}), "messages"),
    ],
)
async def test_malformed_requests_get_400_without_reaching_the_coordinator(
    rig: Rig, path: str, body: bytes, param: str | None
) -> None:
    async with rig.http.post(f"{rig.url}{path}", data=body,
                             headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 400
        err = await resp.json()
    assert_openai_error(err, "invalid_request_error")
    assert err["error"]["param"] == param
    assert rig.fake.requests == []


async def test_client_request_id_reaches_coordinator_and_comes_back(rig: Rig) -> None:
    async with rig.http.post(f"{rig.url}/v1/completions", json=COMPLETION,
                             headers={"X-Request-Id": "client-rid-42"}) as resp:
        assert resp.status == 200
        assert resp.headers["X-Request-Id"] == "client-rid-42"
    assert rig.fake.requests[0].request_id == "client-rid-42"
    assert rig.fake.metadata[0]["x-request-id"] == "client-rid-42"


async def test_missing_request_id_is_generated_and_consistent(rig: Rig) -> None:
    rig.fake.script = replay(head(200, "text/event-stream"), chunk(b"data: [DONE]\n\n"))
    async with rig.http.post(f"{rig.url}/v1/chat/completions", json=CHAT) as resp:
        rid = resp.headers["X-Request-Id"]
        await resp.read()
    assert len(rid) >= 16
    assert rig.fake.requests[0].request_id == rid
    assert rig.fake.metadata[0]["x-request-id"] == rid


async def test_client_disconnect_mid_stream_cancels_the_grpc_call(rig: Rig) -> None:
    rig.fake.script = hanging(head(200, "text/event-stream"), chunk(b'data: {"n":1}\n\n'))
    resp = await rig.http.post(f"{rig.url}/v1/chat/completions", json=CHAT)
    assert await asyncio.wait_for(resp.content.readline(), 5) == b'data: {"n":1}\n'
    resp.close()  # drop the connection
    await asyncio.wait_for(rig.fake.cancelled.wait(), 5)


async def test_client_disconnect_before_head_cancels_the_grpc_call(rig: Rig) -> None:
    rig.fake.script = hanging()
    with pytest.raises(asyncio.TimeoutError):
        await rig.http.post(f"{rig.url}/v1/completions", json=COMPLETION,
                            timeout=aiohttp.ClientTimeout(total=0.5))
    await asyncio.wait_for(rig.fake.cancelled.wait(), 5)


async def test_a_non_streamed_answer_past_the_limit_is_a_502_and_stops_the_request(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    limit = 1024 * 1024
    monkeypatch.setattr(app, "MAX_ANSWER_BYTES", limit)
    piece, total = 64 * 1024, 32 * 1024 * 1024
    produced = [0]
    stopped = asyncio.Event()

    async def big(request: cpb.DispatchRequest, context: Any) -> AsyncIterator[cpb.DispatchResponse]:
        yield head(200, "application/json")
        try:
            while produced[0] < total:
                produced[0] += piece
                yield chunk(b"x" * piece)
        except (asyncio.CancelledError, GeneratorExit):  # stopped while yielding
            stopped.set()
            raise

    rig.fake.script = big
    async with rig.http.post(f"{rig.url}/v1/completions", json=COMPLETION) as resp:
        assert resp.status == 502
        body = await resp.json()
    assert_openai_error(body, "server_error")
    assert body["error"]["code"] == "response_too_large"
    assert f"larger than {limit} bytes" in body["error"]["message"]
    await asyncio.wait_for(stopped.wait(), 5)
    # The request stopped soon after the limit: the coordinator made little more than the front
    # collected (at most the limit), not the whole answer (over gRPC, HTTP/2 windows lead by a few MiB).
    assert produced[0] <= limit + 8 * 1024 * 1024 < total


async def test_missing_head_is_a_502(rig: Rig) -> None:
    rig.fake.script = replay(chunk(b"oops"))
    async with rig.http.post(f"{rig.url}/v1/completions", json=COMPLETION) as resp:
        assert resp.status == 502
        assert_openai_error(await resp.json(), "server_error")


async def test_unknown_route_is_an_openai_404(rig: Rig) -> None:
    async with rig.http.post(f"{rig.url}/v1/audio/transcriptions", json=COMPLETION) as resp:
        assert resp.status == 404
        assert_openai_error(await resp.json(), "invalid_request_error")
