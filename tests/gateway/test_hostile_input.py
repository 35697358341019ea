"""Hostile but legal clients against the OpenAI front (``motor-gateway`` over gRPC and the
coordinator's co-located front): every bound answers with its status and an OpenAI error object,
and a refused request reaches no coordinator (``fake.requests`` stays empty)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import time
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from motor_common.openai_front.admission import AdmissionConfig
from motor_common.openai_front.limits import HttpLimits
from motor_gateway.config import GatewayConfig
from tests.gateway.fakes import (
    FakeDispatch,
    chunk,
    fake_coordinator,
    head,
    in_process_gateway,
    replay,
    running_gateway,
)
from tests.gateway.test_dispatch import assert_openai_error
from tests.helpers import wait_for

COMPLETION = {"model": "tiny", "prompt": "hello", "max_tokens": 4}
LIMITS = HttpLimits(max_body_bytes=64 * 1024, header_timeout_sec=1.0, body_timeout_sec=1.0, max_connections=8)


@dataclass
class Front:
    url: str
    port: int
    fake: FakeDispatch
    http: aiohttp.ClientSession

    async def post(self, body: bytes, headers: dict[str, str] | None = None,
                   path: str = "/v1/completions") -> tuple[int, Any, Any]:
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        async with self.http.post(self.url + path, data=body, headers=hdrs) as resp:
            return resp.status, resp.headers.copy(), orjson.loads(await resp.read())


@pytest.fixture(params=["grpc", "in_process"])
async def front(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Front]:
    http = aiohttp.ClientSession(auto_decompress=False)
    try:
        if request.param == "in_process":
            async with in_process_gateway(limits=LIMITS) as (url, fake):
                yield Front(url, int(url.rsplit(":", 1)[1]), fake, http)
            return
        async with fake_coordinator() as (addr, fake):
            cfg = GatewayConfig(coordinators=(addr,), request_timeout_sec=5.0, limits=LIMITS)
            async with running_gateway(cfg, tmp_path) as url:
                yield Front(url, int(url.rsplit(":", 1)[1]), fake, http)
    finally:
        await http.close()


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth - 1):
        value = [value]
    return value


async def raw_exchange(port: int, data: bytes, *, timeout: float = 5.0) -> bytes:
    """Send *data* on a fresh connection, return everything received until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def body_of(response: bytes) -> Any:
    return orjson.loads(response.split(b"\r\n\r\n", 1)[1])


# --- JSON depth ------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [65, 300, 1000, 5000])
async def test_json_nested_deeper_than_the_limit_is_400_with_an_openai_error(front: Front, depth: int) -> None:
    body = orjson.dumps({**COMPLETION, "logit_bias": {"x": "PLACEHOLDER"}}).replace(
        b'"PLACEHOLDER"', b"[" * depth + b"1" + b"]" * depth)
    status, _, err = await front.post(body)
    assert status == 400
    assert_openai_error(err, "invalid_request_error")
    assert err["error"]["code"] == "json_too_deep"
    assert "at most 64 levels" in err["error"]["message"]
    assert front.fake.requests == []


async def test_json_at_the_depth_limit_is_dispatched(front: Front) -> None:
    body = {**COMPLETION, "response_format": nested(62)}  # + the body object = 63 levels
    status, _, _ = await front.post(orjson.dumps(body))
    assert status == 200
    assert orjson.loads(front.fake.requests[0].body) == body


# --- X-Request-Id ----------------------------------------------------------------------------


@pytest.mark.parametrize("rid", [b"caf\xc3\xa9", b"a\xffb", b"has space", b"r" * 129, b"\t"])
async def test_unusable_request_id_is_replaced_and_the_request_served(front: Front, rid: bytes) -> None:
    body = orjson.dumps(COMPLETION)
    head_ = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
             b"X-Request-Id: " + rid + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    response = await raw_exchange(front.port, head_ + body)
    assert status_of(response) == 200, response[:300]
    sent = front.fake.requests[0].request_id
    assert sent and sent.encode() != rid and sent.isascii() and sent.isprintable() and len(sent) <= 128
    assert b"X-Request-Id: " + sent.encode() in response


async def test_control_bytes_in_a_header_are_a_protocol_400_without_a_traceback(
        front: Front, caplog: pytest.LogCaptureFixture) -> None:
    body = orjson.dumps(COMPLETION)
    head_ = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: x\x01y\r\n"
             b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    response = await raw_exchange(front.port, head_ + body)
    assert status_of(response) == 400  # aiohttp's parser refuses the message before any route
    err = body_of(response)
    assert_openai_error(err, "invalid_request_error")
    assert err["error"]["code"] == "bad_request"
    assert front.fake.requests == []
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]


@pytest.mark.parametrize("head_", [
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 10000 + b"\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"GET /" + b"p" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
])
async def test_malformed_http_is_answered_with_an_openai_error(front: Front, head_: bytes) -> None:
    response = await raw_exchange(front.port, head_)
    assert 400 <= status_of(response) < 500
    assert_openai_error(body_of(response), "invalid_request_error")
    assert front.fake.requests == []


async def test_a_valid_request_id_is_kept(front: Front) -> None:
    status, headers, _ = await front.post(orjson.dumps(COMPLETION), {"X-Request-Id": "client-42:a/b"})
    assert status == 200
    assert headers["X-Request-Id"] == "client-42:a/b"
    assert front.fake.requests[0].request_id == "client-42:a/b"


# --- Content-Encoding ------------------------------------------------------------------------


async def test_gzip_declared_on_a_plain_body_is_400(front: Front) -> None:
    status, _, err = await front.post(orjson.dumps(COMPLETION), {"Content-Encoding": "gzip"})
    assert status == 400
    assert_openai_error(err, "invalid_request_error")
    assert err["error"]["code"] == "invalid_body"
    assert front.fake.requests == []


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
async def test_compressed_bodies_are_decoded_and_served(front: Front, coding: str) -> None:
    raw = orjson.dumps(COMPLETION)
    data = gzip.compress(raw) if coding == "gzip" else zlib.compress(raw)
    status, _, _ = await front.post(data, {"Content-Encoding": coding})
    assert status == 200
    assert orjson.loads(front.fake.requests[0].body) == COMPLETION


async def test_bytes_after_the_compressed_body_are_400_and_gzip_members_are_all_read(front: Front) -> None:
    raw = orjson.dumps(COMPLETION)
    status, _, err = await front.post(gzip.compress(raw) + b"trailing garbage", {"Content-Encoding": "gzip"})
    assert status == 400 and err["error"]["code"] == "invalid_body"
    assert front.fake.requests == []
    half = len(raw) // 2
    status, _, _ = await front.post(gzip.compress(raw[:half]) + gzip.compress(raw[half:]), {"Content-Encoding": "gzip"})
    assert status == 200
    assert orjson.loads(front.fake.requests[0].body) == COMPLETION  # the whole body, as gzip -d gives it


async def test_gzip_bomb_is_413(front: Front) -> None:
    bomb = gzip.compress(b'{"model": "tiny", "prompt": "' + b" " * (8 * 1024 * 1024) + b'"}')
    assert len(bomb) < LIMITS.max_body_bytes
    status, _, err = await front.post(bomb, {"Content-Encoding": "gzip"})
    assert status == 413
    assert_openai_error(err, "invalid_request_error")
    assert front.fake.requests == []


@pytest.mark.parametrize("coding", ["br", "zstd", "compress", "x-custom", "gzip, snappy"])
async def test_unknown_content_encoding_is_415(front: Front, coding: str) -> None:
    status, _, err = await front.post(orjson.dumps(COMPLETION), {"Content-Encoding": coding})
    assert status == 415
    assert_openai_error(err, "invalid_request_error")
    assert err["error"]["code"] == "unsupported_content_encoding"
    assert front.fake.requests == []


# --- model and PD fields ---------------------------------------------------------------------


@pytest.mark.parametrize("size", [257, 4096, 9000])
async def test_overlong_model_is_400_model_too_long_never_429(front: Front, size: int) -> None:
    status, _, err = await front.post(orjson.dumps({**COMPLETION, "model": "m" * size}))
    assert status == 400
    assert_openai_error(err, "invalid_request_error")
    assert err["error"]["param"] == "model"
    assert err["error"]["code"] == "model_too_long"
    assert front.fake.requests == []


@pytest.mark.parametrize("field", ["kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room",
                                   "ec_transfer_params", "bootstrap_pair_key"])
async def test_client_supplied_pd_handoff_fields_are_refused(front: Front, field: str) -> None:
    body = {**COMPLETION, field: {"do_remote_prefill": True, "remote_block_ids": None}}
    status, _, err = await front.post(orjson.dumps(body))
    assert status == 400
    assert_openai_error(err, "invalid_request_error")
    assert err["error"]["param"] == field
    assert err["error"]["code"] == "reserved_field"
    assert front.fake.requests == []


# --- body size and slow clients --------------------------------------------------------------


async def test_declared_oversized_body_is_413_before_the_body_is_sent(front: Front) -> None:
    head_ = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: 62914560\r\n\r\n")  # 60 MiB announced, not one byte sent
    response = await raw_exchange(front.port, head_, timeout=5)
    assert status_of(response) == 413
    assert_openai_error(body_of(response), "invalid_request_error")
    assert front.fake.requests == []


async def test_chunked_body_over_the_limit_is_413(front: Front) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(40):
            yield b"x" * 4096
        yield b'"}'

    async with front.http.post(front.url + "/v1/completions", data=chunks()) as resp:
        assert resp.status == 413
        assert_openai_error(await resp.json(), "invalid_request_error")
    assert front.fake.requests == []


async def test_slow_header_client_is_disconnected_after_header_timeout(front: Front) -> None:
    """No upper bound on when (a loaded box delays any timer): the head trickles one byte every
    0.2 s, > 200 s in all, so a close while most of it is unsent is the server's header timeout."""
    head_ = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
    sent = 0
    start = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", front.port)

    async def trickle() -> None:  # one byte every 0.2 s (pacing), never completing the head
        nonlocal sent
        with contextlib.suppress(ConnectionError):
            for byte in head_:
                writer.write(bytes([byte]))
                await writer.drain()
                sent += 1
                await asyncio.sleep(0.2)

    task = asyncio.create_task(trickle())
    try:
        data = await asyncio.wait_for(reader.read(), 60)
        elapsed, unsent = time.monotonic() - start, len(head_) - sent
    finally:
        task.cancel()
        writer.close()
    assert data == b""  # closed without an answer
    assert unsent > len(head_) // 2, f"closed only after {sent} of {len(head_)} bytes"
    assert elapsed >= LIMITS.header_timeout_sec - 0.05  # ...and not before the timeout


async def test_slow_body_is_408(front: Front) -> None:
    head_ = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: 1000\r\n\r\n{\"model\": ")
    start = time.monotonic()
    # the body never completes, so any answer is the body timeout's (no upper bound on when: a
    # loaded box delays any timer), and it comes no sooner than the timeout
    response = await raw_exchange(front.port, head_, timeout=60)
    assert status_of(response) == 408
    assert_openai_error(body_of(response), "invalid_request_error")
    assert time.monotonic() - start >= LIMITS.body_timeout_sec - 0.05
    assert front.fake.requests == []


async def _in_flight(url: str, route: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    prefix = f'motor_gateway_requests_in_flight{{route="{route}"}} '
    return sum(float(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix))


async def test_idle_connections_declaring_large_bodies_do_not_take_the_body_budget() -> None:
    idle = 4  # together they declare the whole budget
    admission = AdmissionConfig(max_buffered_bytes=4 * LIMITS.max_body_bytes)
    limits = replace(LIMITS, body_timeout_sec=60.0)  # they stay idle for the whole test
    async with in_process_gateway(limits=limits, admission=admission) as (url, fake):
        port = int(url.rsplit(":", 1)[1])
        before = await _in_flight(url, "/v1/completions")
        declared = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n{" % LIMITS.max_body_bytes)
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(idle)]
        try:
            for _, w in held:
                w.write(declared)
            await wait_for(lambda: _awaited(url, before + idle), timeout=10, what="the idle bodies being read")
            async with aiohttp.ClientSession() as http, http.post(url + "/v1/completions", json=COMPLETION) as r:
                assert r.status == 200, await r.read()
            assert len(fake.requests) == 1
        finally:
            for _, w in held:
                w.close()


async def _awaited(url: str, n: float) -> bool:
    return await _in_flight(url, "/v1/completions") >= n


async def test_connections_beyond_the_limit_get_503_and_are_closed(front: Front) -> None:
    held = [await asyncio.open_connection("127.0.0.1", front.port) for _ in range(LIMITS.max_connections)]
    try:
        # the server registers each accepted connection; the next one is over the limit
        response = await raw_exchange(front.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(response) == 503
        err = body_of(response)
        assert_openai_error(err, "service_unavailable_error")
        assert err["error"]["code"] == "too_many_connections"
    finally:
        for _, w in held:
            w.close()
    # once they are gone, new connections are served again
    for _ in range(100):
        try:
            status, _, _ = await front.post(orjson.dumps(COMPLETION))
        except aiohttp.ClientError:
            status = 0
        if status == 200:
            break
        await asyncio.sleep(0.05)
    assert status == 200


# --- engine errors in one shape --------------------------------------------------------------


async def test_sglang_style_engine_4xx_is_relayed_in_the_openai_shape(front: Front) -> None:
    engine = b'{"object":"error","message":"max_tokens is too large","type":"BadRequestError","param":null,"code":400}'
    front.fake.script = replay(head(400), chunk(engine))
    status, _, err = await front.post(orjson.dumps(COMPLETION))
    assert status == 400
    assert err == {"error": {"message": "max_tokens is too large", "type": "BadRequestError",
                             "param": None, "code": 400}}


async def test_engine_5xx_body_is_replaced_by_a_public_message(front: Front) -> None:
    engine = b'{"error":{"message":"KV transfer failed: NIXL handshake with 10.1.2.3:5600 (AssertionError)",' \
             b'"type":"InternalServerError","param":null,"code":500}}'
    front.fake.script = replay(head(500), chunk(engine))
    status, _, err = await front.post(orjson.dumps(COMPLETION), {"X-Request-Id": "rid-5xx"})
    assert status == 500
    assert_openai_error(err, "server_error")
    assert "10.1.2.3" not in err["error"]["message"] and "AssertionError" not in err["error"]["message"]
    assert "rid-5xx" in err["error"]["message"]


async def test_300_trickling_connections_are_all_cut_off_and_the_front_keeps_serving(
        tmp_path: Path) -> None:
    """The probe of the issue: 300 connections trickling a header byte at a time held the front
    for 91 s. Each is now closed after header_timeout_sec; the excess beyond max_connections is
    refused at once; a normal client is served throughout."""
    limits = HttpLimits(header_timeout_sec=1.5, max_connections=200)
    async with fake_coordinator() as (addr, _):
        cfg = GatewayConfig(coordinators=(addr,), limits=limits)
        async with running_gateway(cfg, tmp_path) as url, aiohttp.ClientSession() as http:
            port = int(url.rsplit(":", 1)[1])
            conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(300)]
            # No wall-clock bound on when each is cut off (a loaded box delays every timer): a
            # head of 234 bytes at >= 0.5 s each takes > 110 s to complete, so a connection
            # closed by the server while its head is incomplete was cut off, not served.
            head_ = b"GET /v1/models HTTP/1.1\r\nX-Slow: " + b"a" * 200
            cut_off: list[bool] = []

            async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                completed = False  # the whole head went out, the server never closed
                with contextlib.suppress(ConnectionError):  # closed by the server while we wrote
                    for byte in head_:
                        if reader.at_eof():
                            break
                        writer.write(bytes([byte]))
                        await writer.drain()
                        try:
                            await asyncio.wait_for(reader.read(), 0.5)  # EOF (cut off) or timeout
                            break
                        except TimeoutError:
                            continue
                    else:
                        completed = True
                cut_off.append(not completed)
                writer.close()

            tasks = [asyncio.create_task(trickle(r, w)) for r, w in conns]
            # a well-behaved client meanwhile (retried while the slow ones hold every slot)
            async def served() -> bool:
                try:
                    async with http.post(f"{url}/v1/completions", json=COMPLETION) as resp:
                        return resp.status == 200
                except aiohttp.ClientError:
                    return False

            # (the slow ones, were they not cut off, would hold every slot for > 110 s)
            deadline = time.monotonic() + 60
            ok = False
            while not ok and time.monotonic() < deadline:
                ok = await served()
            await asyncio.wait_for(asyncio.gather(*tasks), 90)
    assert ok
    assert len(cut_off) == 300 and all(cut_off), f"{cut_off.count(False)} connections were never cut off"
