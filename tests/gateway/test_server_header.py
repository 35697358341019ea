"""The gateway's Server header names no Python or aiohttp version (on answers, on errors from its
routes, and on the malformed-HTTP answers its protocol handler writes itself), and
GET /v1/models/{id} (OpenAI's retrieve) answers a model card or a 404 in OpenAI's error shape."""

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


async def test_retrieve_one_model_or_404_in_openai_shape(front: Front) -> None:  # noqa: F811
    async with front.http.get(front.url + "/v1/models/tiny") as resp:
        assert resp.status == 200
        assert orjson.loads(await resp.read()) == {"id": "tiny", "object": "model", "created": 1_700_000_000,
                                                   "owned_by": "motor"}
    async with front.http.get(front.url + "/v1/models/org/other-model") as resp:
        assert resp.status == 404
        err = orjson.loads(await resp.read())["error"]
        assert (err["type"], err["code"], err["param"]) == ("not_found_error", "model_not_found", "model")
        assert "'org/other-model'" in err["message"]
