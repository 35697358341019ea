"""Engine adapters' request rewriting, bootstrap injection, body parsing, metrics parsing."""

from __future__ import annotations

import orjson
import pytest

from motor_common.domain import Endpoint, EngineType
from motor_common.errors import InvalidArgument
from motor_coordinator.adapters import SGLangAdapter, VllmAdapter
from motor_coordinator.adapters.sglang import inject_bootstrap
from motor_coordinator.adapters.vllm import PREFILL_KV_TRANSFER_PARAMS
from motor_coordinator.monitor import parse_load
from motor_coordinator.request import CHAT, COMPLETIONS, parse_body, prompt_prefix

P = Endpoint(0, "10.0.0.1", 8000, bootstrap_port=8998)


def test_vllm_prefill_body_asks_for_a_remote_decode_and_one_token() -> None:
    body = {"model": "m", "prompt": "hi", "stream": True, "max_tokens": 50, "max_completion_tokens": 50,
            "stream_options": {"include_usage": True}, "min_tokens": 3, "temperature": 0}
    out = VllmAdapter().prefill_body(body, P)
    assert out == {"model": "m", "prompt": "hi", "stream": False, "max_tokens": 1, "max_completion_tokens": 1,
                   "temperature": 0, "kv_transfer_params": dict(PREFILL_KV_TRANSFER_PARAMS)}
    assert out["kv_transfer_params"]["do_remote_decode"] is True
    assert body["stream"] is True and "kv_transfer_params" not in body  # input untouched


def test_vllm_decode_body_carries_the_prefill_kv_transfer_params() -> None:
    body = {"model": "m", "prompt": "hi", "stream": True, "max_tokens": 50}
    params = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [1, 2]}
    a = VllmAdapter()
    assert a.decode_body(body, {}, {"kv_transfer_params": params}) == {**body, "kv_transfer_params": params}
    assert a.decode_body(body, {}, {"choices": []}) == body
    assert not a.concurrent and SGLangAdapter().concurrent


@pytest.mark.parametrize("junk", ["x" * 1000, ["a", 1], 7, True, 1.5])
def test_vllm_decode_body_drops_kv_transfer_params_that_are_not_an_object(junk: object) -> None:
    """A prefill's malformed hand-off never reaches the decode (whose 400 about a field the client
    did not send would come back as the client's error): the decode computes the prompt itself."""
    body = {"model": "m", "prompt": "p"}
    assert VllmAdapter().decode_body(body, {}, {"kv_transfer_params": junk}) == body


def test_sglang_bootstrap_injection_is_pure_and_uses_the_prefill_bootstrap_port() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    out = inject_bootstrap(body, P, 123)
    assert out == {**body, "bootstrap_host": "10.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 123}
    assert "bootstrap_room" not in body
    v6 = inject_bootstrap(body, Endpoint(0, "[::1]", 8000, bootstrap_port=9), 1)
    assert v6["bootstrap_host"] == "::1"


def test_sglang_adapter_sends_the_same_body_to_both_with_a_63_bit_room() -> None:
    a = SGLangAdapter()
    rooms = set()
    for _ in range(50):
        pb = a.prefill_body({"model": "m"}, P)
        assert a.decode_body({"model": "m"}, pb, None) == pb
        assert 0 <= pb["bootstrap_room"] < 2**63
        rooms.add(pb["bootstrap_room"])
    assert len(rooms) == 50


@pytest.mark.parametrize(
    ("api", "raw", "reason"),
    [
        (COMPLETIONS, b"{not json", "INVALID_JSON"),
        (COMPLETIONS, b"[1]", "INVALID_BODY"),
        (COMPLETIONS, b'{"prompt": "x"}', "MISSING_MODEL"),
        (COMPLETIONS, b'{"model": 3, "prompt": "x"}', "INVALID_BODY"),
        (COMPLETIONS, b'{"model": "m", "prompt": "x", "stream": "yes"}', "INVALID_BODY"),
        (COMPLETIONS, b'{"model": "m"}', "INVALID_BODY"),
        (CHAT, b'{"model": "m", "messages": []}', "INVALID_BODY"),
        (CHAT, b'{"model": "m", "messages": ["x"]}', "INVALID_BODY"),
    ],
)
def test_bad_bodies_are_invalid_argument(api: str, raw: bytes, reason: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_body(api, raw)
    assert err.value.reason == reason


def test_prompt_prefix_of_completions_and_chat() -> None:
    r = parse_body(COMPLETIONS, orjson.dumps({"model": "m", "prompt": "abcdef", "stream": True}))
    assert r.stream and prompt_prefix(r, 3) == "abc" and r.path == "/v1/completions"
    c = parse_body(CHAT, orjson.dumps({"model": "m", "messages": [
        {"role": "system", "content": "sys"}, {"role": "user", "content": [{"type": "text", "text": "hello"}]}]}))
    assert prompt_prefix(c, 100) == "<system>sys<user>hello" and c.path == "/v1/chat/completions"


@pytest.mark.parametrize("text", [None, 5, ["x"], {"a": 1}])
def test_prompt_prefix_skips_content_parts_whose_text_is_not_a_string(text: object) -> None:
    """The engine judges such a part (400); routing must not fail on it (it raised TypeError: a 500)."""
    c = parse_body(CHAT, orjson.dumps({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": text}, {"type": "text", "text": "ok"}, "not a part"]}]}))
    assert prompt_prefix(c, 100) == "<user>ok"


def test_parse_load_reads_each_engines_gauges() -> None:
    vllm = (
        '# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 99.0\n'
    )
    load = parse_load(vllm, EngineType.VLLM)
    assert (load.running, load.waiting, load.kv_usage) == (3.0, 2.0, 0.25)
    sgl = 'sglang:num_running_reqs{model_name="a b"} 1\nsglang:num_queue_reqs 4\nsglang:token_usage{x="}"} 0.5\n'
    load = parse_load(sgl, EngineType.SGLANG)
    assert (load.running, load.waiting, load.kv_usage) == (1.0, 4.0, 0.5)


ERR = b'{"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}'
ROLE = (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,'
        b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n')


def test_vllm_kv_load_failure_is_recognised_in_json_and_stream_answers() -> None:
    """The shapes real vLLM 0.32 answers when a decode's NIXL load fails (policy fail)."""
    from motor_coordinator.adapters.vllm import kv_load_failed

    sse = "text/event-stream; charset=utf-8"
    assert kv_load_failed(500, "application/json", ERR.replace(b" ", b"")) is True
    assert kv_load_failed(500, "application/json", b"not json") is False
    assert kv_load_failed(500, "application/json", b'{"error": {"type": "BadRequestError"}}') is False
    assert kv_load_failed(400, "application/json", ERR) is False
    assert kv_load_failed(200, "application/json", b'{"choices": []}') is False
    # streamed: the error is the first event (completions) or follows chat's role chunk
    assert kv_load_failed(200, sse, b"data: " + ERR + b"\n\ndata: [DONE]\n\n") is True
    assert kv_load_failed(200, sse, ROLE + b"data: " + ERR + b"\n\n") is True
    # not decided yet: nothing complete, or only the role chunk so far
    assert kv_load_failed(200, sse, b"data: {\"err") is None
    assert kv_load_failed(200, sse, ROLE) is None
    # a token, a finish or [DONE] first: healthy
    token = b'data: {"choices":[{"index":0,"text":" the","finish_reason":null}]}\n\n'
    assert kv_load_failed(200, sse, token + b"data: " + ERR + b"\n\n") is False
    assert kv_load_failed(200, sse, ROLE + token) is False
    assert kv_load_failed(200, sse, b"data: [DONE]\n\n") is False
    assert kv_load_failed(200, sse, b": keep-alive\n\n") is None
    assert kv_load_failed(200, sse, b"x" * (64 * 1024 + 1)) is False  # bounded peek
    assert SGLangAdapter().handoff_failed(500, "application/json", ERR) is False
    assert VllmAdapter().handoff_failed(500, "application/json", ERR) is True
