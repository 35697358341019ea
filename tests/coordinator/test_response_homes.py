"""response_homes.py (pure): the bounded memory of where stored responses live, the order engines
are asked in, and reading the id from a /v1/responses answer (JSON or a stream's first event)."""

from __future__ import annotations

import orjson
import pytest

from motor_common.errors import InvalidArgument
from motor_common.openai_bounds import check_response_id
from motor_coordinator.request import RESPONSES, RESPONSES_CANCEL, RESPONSES_RETRIEVE, parse_body
from motor_coordinator.response_homes import MAX_PROBES, ResponseHomes, probe_order, response_id_of


def test_the_memory_is_bounded_and_forgets_the_least_recently_used() -> None:
    homes: ResponseHomes[str] = ResponseHomes(capacity=3)
    for i in range(3):
        homes.remember(f"resp_{i}", f"engine-{i}")
    assert homes.home("resp_0") == "engine-0"  # used: now the most recent
    homes.remember("resp_3", "engine-3")
    assert len(homes) == 3 and homes.home("resp_1") is None
    assert [homes.home(f"resp_{i}") for i in (0, 2, 3)] == ["engine-0", "engine-2", "engine-3"]
    homes.remember("resp_0", "engine-9")  # a re-created id moves
    assert homes.home("resp_0") == "engine-9" and len(homes) == 3


def test_the_remembered_engine_is_asked_first_then_the_others_at_most_max_probes() -> None:
    cands = [f"c{i}" for i in range(20)]
    keys = [("127.0.0.1", 9000 + i) for i in range(20)]
    assert probe_order(cands, keys, ("127.0.0.1", 9005))[:3] == ["c5", "c0", "c1"]
    assert len(probe_order(cands, keys, None)) == MAX_PROBES
    assert probe_order(cands, keys, ("10.0.0.1", 1)) == cands[:MAX_PROBES]  # gone from the registry
    assert probe_order([], [], ("127.0.0.1", 9005)) == []


def test_the_id_of_a_json_answer_and_of_a_streams_first_event() -> None:
    body = orjson.dumps({"id": "resp_0123456789abcdef", "object": "response", "output": []})
    assert response_id_of("application/json", body) == "resp_0123456789abcdef"
    event = (b"event: response.created\ndata: " + orjson.dumps(
        {"response": {"id": "resp_fedcba9876543210", "status": "in_progress"}, "sequence_number": 0,
         "type": "response.created"}) + b"\n\nevent: response.in_progress\ndata: {")
    assert response_id_of("text/event-stream", event) == "resp_fedcba9876543210"
    assert response_id_of("text/event-stream", event[:40]) is None  # the first event is not complete yet
    for junk in (b"", b"not json", b"[1]", b'{"id": 5}', b'{"id": "has space"}', b'{"no": "id"}'):
        assert response_id_of("application/json", junk) is None


@pytest.mark.parametrize("bad", ["", "has space", "slash/inside", "r" * 257, "ünïcode", 5, None])
def test_a_response_id_is_bounded(bad: object) -> None:
    with pytest.raises(InvalidArgument) as err:
        check_response_id(bad)
    assert err.value.metadata["param"] == "response_id"


def test_stored_response_bodies_from_dispatch_are_checked() -> None:
    req = parse_body(RESPONSES_RETRIEVE, b'{"response_id": "resp_1", "stream": true, "starting_after": 3}')
    assert (req.path, req.method, req.engine_body, req.response_id) == (
        "/v1/responses/resp_1?stream=true&starting_after=3", "GET", {}, "resp_1")
    cancel = parse_body(RESPONSES_CANCEL, b'{"response_id": "resp_1"}')
    assert (cancel.path, cancel.method) == ("/v1/responses/resp_1/cancel", "POST")
    cont = parse_body(RESPONSES, b'{"input": "x", "previous_response_id": "resp_0"}')
    assert cont.response_id == "resp_0" and cont.path == "/v1/responses"
    assert parse_body(RESPONSES, b'{"input": "x"}').response_id is None
    for api, raw, param in (
        (RESPONSES_RETRIEVE, b'{}', "response_id"),
        (RESPONSES_RETRIEVE, b'{"response_id": "a b"}', "response_id"),
        (RESPONSES_RETRIEVE, b'{"response_id": "r", "stream": "yes"}', "stream"),
        (RESPONSES_RETRIEVE, b'{"response_id": "r", "starting_after": -1}', "starting_after"),
        (RESPONSES_RETRIEVE, b'{"response_id": "r", "starting_after": true}', "starting_after"),
        (RESPONSES_CANCEL, b'{"response_id": "r", "stream": true}', "stream"),
        (RESPONSES_RETRIEVE, b'{"response_id": "r", "model": "m"}', "model"),
        (RESPONSES, b'{"input": "x", "previous_response_id": 7}', "previous_response_id"),
    ):
        with pytest.raises(InvalidArgument) as err:
            parse_body(api, raw)
        assert err.value.metadata["param"] == param, raw
