"""Mid-stream migration bookkeeping (pure): what the client got, the continuation, the rewrite."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from motor_coordinator.migration import MAX_PENDING_EVENT_BYTES, StreamTracker, migratable
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


# Every event separator of the SSE spec: a line ends at CRLF, LF or CR; an empty line ends an event.
SEPARATORS = [b"\n\n", b"\r\n\r\n", b"\r\r", b"\n\r\n", b"\r\n\n", b"\n\r", b"\r\n\r"]


def framed(sep: bytes, n: int = 5) -> bytes:
    """A completions stream of *n* tokens and [DONE], its events ended by *sep*."""
    return b"".join(cmpl(f" t{i}")[:-2] + sep for i in range(n)) + b"data: [DONE]" + sep


@pytest.mark.parametrize("sep", SEPARATORS, ids=repr)
@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 1 << 16])
def test_every_sse_framing_is_forwarded_unchanged_event_by_event(sep: bytes, size: int) -> None:
    raw = framed(sep)
    t = StreamTracker(COMPLETIONS)
    out = b"".join(t.feed(raw[i:i + size]) for i in range(0, len(raw), size))
    assert out == raw and t.pending == 0  # every event went out as soon as its blank line arrived
    assert (t.text, t.tokens, t.done) == (" t0 t1 t2 t3 t4", 5, True)


def test_a_crlf_event_goes_out_when_its_blank_line_arrives_not_with_the_next_event() -> None:
    t = StreamTracker(COMPLETIONS)
    first = cmpl(" a")[:-2] + b"\r\n\r\n"
    assert t.feed(first[:-1]) == first[:-1]  # the second CR ends the event
    assert t.feed(first[-1:] + b"data: ") == first[-1:]  # its LF follows it; the next event waits
    assert (t.text, t.pending) == (" a", len(b"data: "))


def test_a_crlf_stream_broken_mid_event_continues_and_its_continuation_is_rewritten() -> None:
    t = StreamTracker(COMPLETIONS)
    sent = t.feed(framed(b"\r\n\r\n", 2)[:-8])  # two tokens, then the engine died in [DONE]'s event
    assert sent.count(b"\r\n\r\n") == 2 and t.tokens == 2
    cont = t.continuation({"prompt": "Say:", "max_tokens": 4})
    assert cont == {"prompt": "Say: t0 t1", "max_tokens": 2}
    raw = cmpl(" x", rid="cmpl-2")[:-2] + b"\r\r" + cmpl(" y", "length", rid="cmpl-2")[:-2] + b"\r\n\r\n"
    out = events(t.rewrite(raw + b"data: [DONE]\r\n\r\n"))
    assert [o if o == "[DONE]" else (o["id"], o["choices"][0]["text"]) for o in out] == [
        ("cmpl-1", " x"), ("cmpl-1", " y"), "[DONE]"]


def test_what_follows_the_last_blank_line_is_sent_when_the_stream_ends() -> None:
    t = StreamTracker(COMPLETIONS)
    raw = cmpl(" a") + b"data: [DONE]"  # an engine that ends without the last blank line
    assert t.feed(raw) == cmpl(" a") and t.pending == len(b"data: [DONE]")
    assert t.feed(b"", end=True) == b"data: [DONE]" and t.done and t.pending == 0
    t = StreamTracker(COMPLETIONS)
    t.feed(cmpl(" a"))
    t.continuation({"prompt": "p", "max_tokens": 3})
    assert events(t.rewrite(cmpl(" b", rid="cmpl-2") + b"data: [DONE]") + t.rewrite(b"", end=True))[-1] == "[DONE]"


def test_a_long_run_without_a_blank_line_is_held_back_at_most_the_bound_then_relayed_as_it_comes() -> None:
    t = StreamTracker(CHAT)
    chunk = b"data: " + b"x" * (64 * 1024 - 6)
    first = b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    out = [t.feed(first)]
    for _ in range(320):  # 20 MiB of one unterminated event
        out.append(t.feed(chunk))
        assert t.pending <= MAX_PENDING_EVENT_BYTES
    assert not t.tracking and t.pending == 0 and t.tokens == 1
    assert b"".join(out) == first + chunk * 320  # the client got every byte, in order
    assert t.feed(chunk) is chunk  # untracked: relayed as it came, not scanned or copied
    more = b"data: x\n" * (MAX_PENDING_EVENT_BYTES // 8 + 1)  # lines, but never an empty one
    t = StreamTracker(CHAT)
    assert t.feed(more) == more and not t.tracking
