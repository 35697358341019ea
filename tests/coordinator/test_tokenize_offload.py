"""Long prompts are tokenized in a worker thread, short ones on the event loop
(``tokenize_offload.py``), with the same ids either way; the Hugging Face tokenizer's piece cache
is shared by both threads. No sockets."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from motor_coordinator.app import Coordinator
from motor_coordinator.config import CoordinatorConfig, KvEventsConfig, SchedulerConfig
from motor_coordinator.hf_tokenizer_loader import load_hf_tokenizer
from motor_coordinator.request import CHAT, COMPLETIONS, ParsedRequest, parsed_request
from motor_coordinator.tokenize_offload import OFFLOAD_CHARS, TokenizeOffload, prompt_chars

pytest.importorskip("tokenizers")  # the dev extra has it; CI installs it
from tests.coordinator.test_hf_tokenizer import TEXT, make_tokenizer


def test_prompt_chars_counts_the_text_to_tokenize() -> None:
    assert prompt_chars({"messages": [{"role": "system", "content": "abc"},
                                      {"role": "user", "content": [{"type": "text", "text": "de"},
                                                                   {"type": "image_url", "image_url": {}}]},
                                      "junk", {"role": "user"}]}) == 5
    assert prompt_chars({"prompt": "hello"}) == 5
    assert prompt_chars({"prompt": ["first", "second one"]}) == 5
    assert prompt_chars({"prompt": [1, 2, 3]}) == 0
    assert prompt_chars({"input": "x" * 10**6}) == 0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("offload") / "model")


def _chat(chars: int) -> ParsedRequest:
    text = (TEXT * (chars // len(TEXT) + 1))[:chars]
    return parsed_request(CHAT, {"model": "m", "messages": [{"role": "system", "content": text},
                                                             {"role": "user", "content": "hi"}]})


async def test_a_long_prompt_is_tokenized_in_the_worker_thread_a_short_one_on_the_loop(model_dir: Path) -> None:
    kv = KvEventsConfig(tokenizer="hf", tokenizer_path=str(model_dir), max_prompt_tokens=512)
    app = Coordinator(CoordinatorConfig(scheduler=SchedulerConfig(policy="kv_events", kv_events=kv)))
    d = app.dispatcher
    assert d.token_ids is not None and d.tokenize_offload is app.tokenize_offload is not None
    inner = d.token_ids
    threads: list[str] = []

    def spy(req: ParsedRequest) -> Any:
        threads.append(threading.current_thread().name)
        return inner(req)

    d.token_ids = spy
    try:
        long, short = _chat(OFFLOAD_CHARS + 10), _chat(200)
        want_long, want_short = inner(long), inner(short)
        assert want_long and len(want_long) == 512 and want_short
        assert await d._prompt_ids(long) == want_long
        assert await d._prompt_ids(short) == want_short
        assert threads[0].startswith("motor-tokenize") and threads[1] == threading.current_thread().name
        assert await d._prompt_ids(parsed_request(COMPLETIONS, {"model": "m", "prompt": [5, 6, 7]})) == (5, 6, 7)
    finally:
        if app.kv_events is not None:
            await app.kv_events.close()
        assert app.tokenize_offload is not None
        app.tokenize_offload.close()
    with pytest.raises(RuntimeError):  # closed: no new work is taken
        await app.tokenize_offload.run(inner, short)


def test_the_piece_cache_gives_the_same_ids_from_many_threads(model_dir: Path) -> None:
    hf = load_hf_tokenizer(str(model_dir))
    hf.cache_entries = 8  # constant eviction: the cache is mutated on almost every call
    bodies = [{"messages": [{"role": "system", "content": f"{TEXT[i:]} {i}"},
                            {"role": "user", "content": f"question {i % 7}"}]} for i in range(40)]
    want = [load_hf_tokenizer(str(model_dir)).chat_ids(b, 4096) for b in bodies]
    with ThreadPoolExecutor(max_workers=4) as pool:
        for _ in range(5):
            assert list(pool.map(lambda b: hf.chat_ids(b, 4096), bodies)) == want


def test_offload_threshold_is_by_characters() -> None:
    off = TokenizeOffload(threshold_chars=10)
    try:
        assert off.wants(parsed_request(COMPLETIONS, {"model": "m", "prompt": "0123456789"}))
        assert not off.wants(parsed_request(COMPLETIONS, {"model": "m", "prompt": "012345678"}))
    finally:
        off.close()
