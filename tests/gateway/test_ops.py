"""Gateway readiness, model list, metrics, API key, socket options and the OpenAI SDK."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import aiohttp
import grpc
import orjson
import pytest
from aiohttp import web
from openai import AsyncOpenAI, AuthenticationError, NotFoundError

from motor_common import errors
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.openai_front.app import Gateway
from motor_gateway.client import GrpcDispatchClient
from motor_gateway.config import GatewayConfig
from motor_gateway.pool import CoordinatorPool
from tests.gateway.conftest import Rig
from tests.gateway.fakes import chunk, failing, fake_coordinator, head, replay, running_gateway
from tests.helpers import free_port, wait_for


async def test_ready_is_ok_when_coordinator_is_ready(rig: Rig) -> None:
    async with rig.http.get(f"{rig.url}/ready") as resp:
        assert resp.status == 200
        assert await resp.json() == {"status": "ok"}


@pytest.mark.parametrize(
    "reason",
    ["no schedulable prefill+decode pair or union instance", "Coordinator is not master", "isolated"],
)
async def test_ready_is_503_with_the_coordinators_reason_while_health_stays_200(rig: Rig, reason: str) -> None:
    rig.fake.ready, rig.fake.reason = False, reason
    async with rig.http.get(f"{rig.url}/ready") as resp:
        assert resp.status == 503
        assert (await resp.json())["reason"] == reason
    # liveness never depends on the coordinator: a probe on /health must not restart this gateway
    async with rig.http.get(f"{rig.url}/health") as resp:
        assert resp.status == 200
        assert await resp.json() == {"status": "ok"}


async def test_ready_is_503_coordinator_unreachable_health_is_200(tmp_path: Path) -> None:
    cfg = GatewayConfig(coordinators=(f"127.0.0.1:{free_port()}",), control_timeout_sec=0.5)
    async with running_gateway(cfg, tmp_path) as url, aiohttp.ClientSession() as http:
        async with http.get(f"{url}/ready") as resp:
            assert resp.status == 503
            assert (await resp.json())["reason"] == "coordinator unreachable"
        async with http.get(f"{url}/health") as resp:
            assert resp.status == 200


async def test_ready_names_coordinators_by_position_never_by_address_or_their_words(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """/ready answers without a credential: its reason must not carry coordinator addresses or
    what a coordinator said when it refused the probe (both go to the gateway's log instead)."""
    secret = "key 'ops' from 10.9.9.9:41234 is not accepted"
    async with fake_coordinator() as (a, fake_a), fake_coordinator() as (b, fake_b):
        fake_a.refuse = (grpc.StatusCode.PERMISSION_DENIED, secret)
        fake_b.ready, fake_b.reason, fake_b.role = False, "Coordinator is not master", cpb.COORDINATOR_ROLE_STANDBY
        cfg = GatewayConfig(coordinators=(a, b), probe_interval_sec=0.1)
        with caplog.at_level(logging.WARNING, logger="motor_gateway.pool"):
            async with running_gateway(cfg, tmp_path) as url, aiohttp.ClientSession() as http:
                async def reason() -> str | None:
                    async with http.get(f"{url}/ready") as resp:
                        body = await resp.text()
                        return body if resp.status == 503 and "coordinator 2" in body else None
                body = await wait_for(reason, timeout=10, what="/ready names both coordinators")
    assert orjson.loads(body)["reason"] == ("no master coordinator (coordinator 1: coordinator unreachable: "
                                             "PERMISSION_DENIED; coordinator 2: Coordinator is not master)")
    for leak in (a, b, "10.9.9.9", "not accepted"):
        assert leak not in body
    refusals = [r for r in caplog.records if r.getMessage() == "coordinator refused the readiness probe"]
    assert refusals and refusals[0].__dict__["detail"] == secret and refusals[0].__dict__["coordinator"] == a
    assert len(refusals) == 1  # once per change, not once per probe


async def test_pool_prefers_the_first_ready_coordinator(tmp_path: Path) -> None:
    async with fake_coordinator() as (a, fake_a), fake_coordinator() as (b, fake_b):
        fake_a.ready, fake_a.reason = False, "Coordinator is not master"
        cfg = GatewayConfig(coordinators=(a, b), probe_interval_sec=0.1)
        async with running_gateway(cfg, tmp_path) as url, aiohttp.ClientSession() as http:
            async with http.get(f"{url}/ready") as resp:
                assert resp.status == 200
            await wait_for(lambda: fake_b.requests or _post(http, url), timeout=5, what="dispatch to b")
            assert fake_a.requests == []


async def _post(http: aiohttp.ClientSession, url: str) -> bool:
    async with http.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "x"}) as resp:
        await resp.read()
    return False


async def test_models_are_listed_in_openai_shape(rig: Rig) -> None:
    rig.fake.models = ["tiny", "small"]
    async with rig.http.get(f"{rig.url}/v1/models") as resp:
        assert resp.status == 200
        body = await resp.json()
    assert body == {
        "object": "list",
        "data": [
            {"id": "tiny", "object": "model", "created": 1_700_000_000, "owned_by": "motor"},
            {"id": "small", "object": "model", "created": 1_700_000_000, "owned_by": "motor"},
        ],
    }


async def test_metrics_count_requests_by_route_and_status(rig: Rig) -> None:
    rig.fake.script = failing(errors.NotFound("nope"))
    async with rig.http.post(f"{rig.url}/v1/completions", json={"model": "m", "prompt": "p"}) as resp:
        assert resp.status == 404
    async with rig.http.get(f"{rig.url}/metrics") as resp:
        text = await resp.text()
    assert 'motor_gateway_requests_total{route="/v1/completions",status="404"}' in text
    assert "motor_gateway_request_seconds_bucket" in text
    assert 'motor_gateway_requests_in_flight{route="/metrics"} 1.0' in text


async def test_api_key_is_required_on_v1_routes_only(tmp_path: Path) -> None:
    key_file = tmp_path / "api.key"
    key_file.write_text("sk-motor-test\n")
    async with fake_coordinator() as (addr, _):
        cfg = GatewayConfig(coordinators=(addr,), api_key_file=str(key_file))
        async with running_gateway(cfg, tmp_path) as url, aiohttp.ClientSession() as http:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sk-motor-test"}):
                async with http.get(f"{url}/v1/models", headers=headers) as resp:
                    assert resp.status == 401
                    body = await resp.json()
                    assert body["error"]["type"] == "authentication_error"
                    assert body["error"]["code"] == "invalid_api_key"
            ok = {"Authorization": "Bearer sk-motor-test"}
            async with http.get(f"{url}/v1/models", headers=ok) as resp:
                assert resp.status == 200
            async with http.get(f"{url}/health") as resp:
                assert resp.status == 200
            client = AsyncOpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0)
            with pytest.raises(AuthenticationError):
                await client.models.list()
            await client.close()


async def test_openai_sdk_completion_chat_and_stream(rig: Rig) -> None:
    completion = (b'{"id":"cmpl-1","object":"text_completion","created":1,"model":"tiny",'
                  b'"choices":[{"index":0,"text":" world","finish_reason":"length","logprobs":null}]}')
    client = AsyncOpenAI(base_url=f"{rig.url}/v1", api_key="none", max_retries=0)
    try:
        rig.fake.script = replay(head(), chunk(completion))
        out = await client.completions.create(model="tiny", prompt="hello", max_tokens=1)
        assert out.choices[0].text == " world"

        events = [
            b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"tiny",'
            b'"choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"finish_reason":null}]}\n\n',
            b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"tiny",'
            b'"choices":[{"index":0,"delta":{"content":" there"},"finish_reason":"stop"}]}\n\n',
            b"data: [DONE]\n\n",
        ]
        rig.fake.script = replay(head(200, "text/event-stream"), *(chunk(e) for e in events))
        stream = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream])
        assert text == "hi there"

        rig.fake.script = failing(errors.NotFound("model 'nope' is not served", reason="MODEL_NOT_FOUND"))
        with pytest.raises(NotFoundError):
            await client.completions.create(model="nope", prompt="x")
        models = await client.models.list()
        assert [m.id for m in models.data] == ["tiny"]
    finally:
        await client.close()


async def test_accepted_sockets_have_tcp_nodelay() -> None:
    pool = CoordinatorPool(["127.0.0.1:1"])
    app = Gateway(GrpcDispatchClient(pool, request_timeout=1, control_timeout=1)).make_app()

    async def nodelay(request: web.Request) -> web.Response:
        sock = request.transport.get_extra_info("socket") if request.transport else None
        assert sock is not None
        return web.Response(text=str(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)))

    app.router.add_get("/_nodelay", nodelay)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/_nodelay") as resp:
            assert (await resp.text()) != "0"
    finally:
        await runner.cleanup()
        await pool.close()
