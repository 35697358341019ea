"""Token ids of a dispatched prompt as the engine will see them (pure)."""

from __future__ import annotations

from typing import Any

from motor_common import toy_tokenizer
from motor_coordinator.prompt_tokens import prompt_token_ids
from motor_coordinator.request import CHAT, COMPLETIONS, parsed_request
from motor_sim.params import parse


def completions(prompt: Any) -> Any:
    return parsed_request(COMPLETIONS, {"model": "m", "prompt": prompt})


def test_prompts_given_as_ids_are_used_as_they_are_for_any_tokenizer_and_capped() -> None:
    assert prompt_token_ids(completions([5, 6, 7]), "none", 100) == (5, 6, 7)
    assert prompt_token_ids(completions([[1, 2], [3]]), "none", 100) == (1, 2)  # a batch: the first
    assert prompt_token_ids(completions(list(range(50))), "none", 10) == tuple(range(10))
    assert prompt_token_ids(completions([1, "x"]), "none", 10) is None  # the engine refuses it
    assert prompt_token_ids(completions([1, -2]), "none", 10) is None


def test_text_and_chat_need_a_tokenizer() -> None:
    assert prompt_token_ids(completions("hello world"), "none", 100) is None
    chat = parsed_request(CHAT, {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert prompt_token_ids(chat, "none", 100) is None


def test_the_simulator_tokenizer_gives_the_ids_motor_sim_caches() -> None:
    text = "The quick brown fox, again and again."
    assert prompt_token_ids(completions(text), "simulator", 100) == tuple(toy_tokenizer.encode(text))
    assert prompt_token_ids(completions(text), "simulator", 100) == parse({"prompt": text}, "completion").prompt_ids
    assert prompt_token_ids(completions([text, "other"]), "simulator", 3) == tuple(toy_tokenizer.encode(text))[:3]
    for extra in ({}, {"add_generation_prompt": False},
                  {"continue_final_message": True, "add_generation_prompt": False}):  # fmt: skip
        body = {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": [{"type": "text", "text": "hi there"}]}],
                **extra}  # fmt: skip
        ids = prompt_token_ids(parsed_request(CHAT, body), "simulator", 1000)
        assert ids == parse(body, "chat").prompt_ids  # what the simulator itself tokenizes
    bad = parsed_request(CHAT, {"model": "m", "messages": [{"content": "no role"}]})
    assert prompt_token_ids(bad, "simulator", 100) is None


def test_the_message_cache_gives_the_same_ids_as_tokenizing_the_whole_prompt_and_stays_bounded() -> None:
    from motor_coordinator.prompt_tokens import PromptTokens

    tokens = PromptTokens("simulator", 10_000, cache_entries=3)
    system = {"role": "system", "content": "Shared system prompt, the same every turn. " * 20}
    history: list[dict[str, Any]] = [system]
    for turn in range(4):
        history.append({"role": "user", "content": [{"type": "text", "text": f"turn {turn}: why?"}]})
        for extra in ({}, {"add_generation_prompt": False},
                      {"continue_final_message": True, "add_generation_prompt": False}):  # fmt: skip
            req = parsed_request(CHAT, {"model": "m", "messages": history, **extra})
            assert tokens(req) == prompt_token_ids(req, "simulator", 10_000) == parse(req.body, "chat").prompt_ids
        history.append({"role": "assistant", "content": f"because {turn}"})
    assert len(tokens._cache) == 3
    short = PromptTokens("simulator", 7)
    req = parsed_request(CHAT, {"model": "m", "messages": history})
    assert short(req) == prompt_token_ids(req, "simulator", 1000)[:7]
    assert short(completions([1, 2, 3])) == (1, 2, 3)  # not chat: the plain function
    assert short(parsed_request(CHAT, {"model": "m", "messages": [{"content": "x"}]})) is None
