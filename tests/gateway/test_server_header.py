"""The gateway's Server header names no Python or aiohttp version: on answers, on errors from its
routes, and on the malformed-HTTP answers its protocol handler writes itself."""

from __future__ import annotations

import orjson

from tests.gateway.test_hostile_input import COMPLETION, Front, front, raw_exchange  # noqa: F401


def assert_anonymous(server: str | None) -> None:
    assert server == "motor-gateway", server


async def test_served_and_refused_requests_say_motor_gateway(front: Front) -> None:  # noqa: F811
    status, headers, _ = await front.post(orjson.dumps(COMPLETION))
    assert status == 200
    assert_anonymous(headers.get("Server"))
    status, headers, _ = await front.post(b"{not json")
    assert status == 400
    assert_anonymous(headers.get("Server"))
    async with front.http.get(front.url + "/no/such/route") as resp:
        assert resp.status == 404
        assert_anonymous(resp.headers.get("Server"))
    async with front.http.get(front.url + "/health") as resp:
        assert_anonymous(resp.headers.get("Server"))


async def test_malformed_http_answer_says_motor_gateway(front: Front) -> None:  # noqa: F811
    response = await raw_exchange(front.port, b"GET /" + b"p" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    head = response.split(b"\r\n\r\n", 1)[0].decode()
    assert "Server: motor-gateway" in head.split("\r\n")
    assert "Python" not in head and "aiohttp" not in head
