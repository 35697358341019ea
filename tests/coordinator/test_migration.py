"""Mid-stream migration bookkeeping (pure): what the client got, the continuation, the rewrite."""

from __future__ import annotations

from typing import Any

import orjson

from motor_coordinator.migration import StreamTracker, migratable
from motor_coordinator.request import CHAT, COMPLETIONS


def ev(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def cmpl(text: str, finish: str | None = None, *, rid: str = "cmpl-1", created: int = 7, **extra: Any) -> bytes:
    return ev({"id": rid, "object": "text_completion", "created": created, "model": "m",
               "choices": [{"index": 0, "text": text, "finish_reason": finish}], **extra})


def events(raw: bytes) -> list[Any]:
    out = []
    for e in raw.split(b"\n\n"):
        if e.startswith(b"data: "):
            p = e[6:]
            out.append("[DONE]" if p == b"[DONE]" else orjson.loads(p))
    return out


def test_what_can_be_migrated() -> None:
    assert migratable(COMPLETIONS, {"prompt": "p", "max_tokens": 5, "stream": True})
    assert migratable(COMPLETIONS, {"prompt": ["p"], "temperature": 0})
    assert migratable(CHAT, {"messages": [{"role": "user", "content": "x"}]})
    for bad in ({"n": 2}, {"echo": True}, {"logprobs": 1}, {"stop": ["x"]}, {"stop_token_ids": [1]},
                {"tools": [{}]}, {"best_of": 2}):
        assert not migratable(COMPLETIONS, {"prompt": "p", **bad}), bad
    assert not migratable(COMPLETIONS, {"prompt": [1, 2, 3]})  # token ids: the text is not enough
    assert not migratable(CHAT, {"messages": [], "continue_final_message": True})


def test_only_whole_events_are_forwarded_and_the_sent_text_is_tracked() -> None:
    t = StreamTracker(COMPLETIONS)
    first = cmpl(" a") + cmpl(" b")
    assert t.feed(first[:10]) == b""
    assert t.feed(first[10:] + cmpl(" c")[:5]) == first
    assert (t.text, t.tokens, t.finished, t.id, t.created) == (" a b", 2, False, "cmpl-1", 7)


def test_completion_continuation_and_rewritten_events_read_as_one_stream() -> None:
    t = StreamTracker(COMPLETIONS)
    t.feed(cmpl(" a") + cmpl(" b") + cmpl(" c")[:7])  # the engine died mid-event
    body = {"model": "m", "prompt": "Say:", "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}
    cont = t.continuation(body)
    assert cont == {**body, "prompt": "Say: a b", "max_tokens": 3}
    usage = {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    raw = (cmpl(" c", rid="cmpl-2", created=9) + cmpl(" d", rid="cmpl-2") + cmpl(" e", "length", rid="cmpl-2")
           + ev({"id": "cmpl-2", "created": 9, "model": "m", "choices": [], "usage": usage}) + b"data: [DONE]\n\n")
    out = events(t.rewrite(raw))
    assert all(o == "[DONE]" or (o["id"], o["created"]) == ("cmpl-1", 7) for o in out)
    assert "".join(o["choices"][0]["text"] for o in out[:3]) == " c d e"
    # usage as the uninterrupted request: prompt 2 tokens, 5 completion tokens
    assert out[3]["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
    assert out[-1] == "[DONE]" and t.done and t.finished and t.text == " a b c d e"


def test_completions_without_max_tokens_continue_to_the_default_16() -> None:
    t = StreamTracker(COMPLETIONS)
    t.feed(cmpl(" a") * 4)
    assert t.continuation({"prompt": "p"}) == {"prompt": "p a a a a", "max_tokens": 12}


def test_chat_continues_the_partial_assistant_message_without_a_second_role_event() -> None:
    t = StreamTracker(CHAT)

    def chunk(delta: dict[str, Any], finish: str | None = None, rid: str = "chatcmpl-1") -> bytes:
        return ev({"id": rid, "object": "chat.completion.chunk", "created": 3, "model": "m",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    t.feed(chunk({"role": "assistant", "content": ""}) + chunk({"content": " hi"}) + chunk({"content": " there"}))
    assert (t.text, t.tokens) == (" hi there", 2)
    msgs = [{"role": "user", "content": "x"}]
    cont = t.continuation({"model": "m", "messages": msgs, "max_completion_tokens": 4, "stream": True})
    assert cont is not None
    assert cont["messages"] == [*msgs, {"role": "assistant", "content": " hi there"}]
    assert cont["continue_final_message"] is True and cont["add_generation_prompt"] is False
    assert cont["max_completion_tokens"] == 2
    out = events(t.rewrite(chunk({"role": "assistant", "content": ""}, rid="chatcmpl-9")
                           + chunk({"content": " you"}, rid="chatcmpl-9")
                           + chunk({"content": " all"}, "length", rid="chatcmpl-9") + b"data: [DONE]\n\n"))
    assert [o if o == "[DONE]" else (o["id"], o["choices"][0]["delta"]) for o in out] == [
        ("chatcmpl-1", {"content": " you"}), ("chatcmpl-1", {"content": " all"}), "[DONE]"]


def test_nothing_left_to_generate_gives_no_continuation() -> None:
    t = StreamTracker(COMPLETIONS)
    t.feed(cmpl(" a") + cmpl(" b", "length"))
    assert t.continuation({"prompt": "p", "max_tokens": 2}) is None
    assert t.tail() == b"data: [DONE]\n\n"
    t = StreamTracker(COMPLETIONS)
    t.feed(cmpl(" a") + cmpl(" b"))
    assert t.continuation({"prompt": "p", "max_tokens": 2}) is None
