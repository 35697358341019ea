"""Every key of scheduler.kv_events is wired: hashing (block size, seed, int form), the token-id
source and bound, the index bound and the replay deadline."""

from __future__ import annotations

import pytest

from motor_common.config import load_config
from motor_common.domain import Role
from motor_common.errors import ConfigError
from motor_common.kv_events import BlockStored, EventBatch, vllm_block_hashes
from motor_coordinator.app import Coordinator
from motor_coordinator.config import CoordinatorConfig, KvEventsConfig, SchedulerConfig
from motor_coordinator.kv_index import KvIndex
from motor_coordinator.policies import PolicyContext, make_policy
from motor_coordinator.policies.base import Candidate, RequestInfo
from motor_coordinator.request import COMPLETIONS, parsed_request
from tests.coordinator.factories import inst

PROMPT = list(range(100, 164))  # 2 blocks of 32, 4 of 16


def _pair(index: KvIndex) -> list[Candidate]:
    out = []
    for i in (1, 2):
        x = inst(i)
        c = Candidate(x, x.endpoints[0])
        index.add_engine(c.key, "m")
        index.apply(c.key, 0, EventBatch(0.0, ()))
        out.append(c)
    return out


@pytest.mark.parametrize(
    ("kv", "held"),
    [
        (KvEventsConfig(block_size=32), [h for h in vllm_block_hashes(PROMPT, 32)]),
        (KvEventsConfig(hash_seed="42"), vllm_block_hashes(PROMPT, 16, "42")),
        (KvEventsConfig(), [int.from_bytes(h[-8:], "big") for h in vllm_block_hashes(PROMPT, 16)]),
    ],
)
def test_the_policy_hashes_with_the_configured_block_size_seed_and_form(kv: KvEventsConfig, held: list[object]) -> None:
    from motor_common.kv_events import vllm_int_hash

    if kv.int_hashes:
        held = [h if isinstance(h, int) else vllm_int_hash(h) for h in held]  # type: ignore[arg-type]
    index = KvIndex()
    c = _pair(index)
    index.apply(c[1].key, 1, EventBatch(0.0, (BlockStored(tuple(held), None, (), kv.block_size),)))  # type: ignore[arg-type]
    policy = make_policy(SchedulerConfig(policy="kv_events", kv_events=kv), PolicyContext(index))
    assert policy.select(Role.PREFILL, c, RequestInfo(0, "m", "p", tuple(PROMPT))) is c[1]
    digests = make_policy(SchedulerConfig(policy="kv_events", kv_events=KvEventsConfig(int_hashes=False)),
                          PolicyContext(index))  # fmt: skip
    # the other form never matches: a cold prefix (the ring decides, counted as cold)
    digests.select(Role.PREFILL, c, RequestInfo(0, "m", "p", tuple(PROMPT)))
    assert digests.cold == 1  # type: ignore[attr-defined]


async def test_the_coordinator_wires_tokenizer_bounds_and_deadline_only_for_kv_events(tmp_path: object) -> None:
    kv = KvEventsConfig(tokenizer="simulator", max_prompt_tokens=5, max_blocks_per_engine=77, replay_timeout_sec=0.5,
                        silence_timeout_sec=7.5)
    app = Coordinator(CoordinatorConfig(scheduler=SchedulerConfig(policy="kv_events", kv_events=kv)))
    try:
        assert app.kv_events is not None and app.kv_events.replay_timeout_s == 0.5
        assert app.kv_index.max_blocks == 77 and app.kv_index.silence_timeout == 7.5
        assert app.dispatcher.token_ids is not None
        req = parsed_request(COMPLETIONS, {"model": "m", "prompt": "one two three four five six seven"})
        ids = app.dispatcher.token_ids(req)
        assert ids is not None and len(ids) == 5
    finally:
        await app.kv_events.close() if app.kv_events else None
    plain = Coordinator(CoordinatorConfig(scheduler=SchedulerConfig(policy="least_load")))
    assert plain.kv_events is None and plain.dispatcher.token_ids is None


def test_bad_kv_events_keys_are_config_errors(tmp_path: object) -> None:
    from pathlib import Path

    p = Path(str(tmp_path)) / "c.yaml"
    for text, what in (("scheduler: {kv_events: {tokenizer: gpt}}", "tokenizer"),
                       ("scheduler: {kv_events: {block_size: 0}}", "block_size"),
                       ("scheduler: {kv_events: {replay_timeout: 1}}", "replay_timeout"),
                       ("scheduler: {kv_events: {silence_timeout_sec: -1}}", "silence_timeout_sec")):  # fmt: skip
        p.write_text(text)
        with pytest.raises(ConfigError, match=what):
            load_config(CoordinatorConfig, str(p), env_prefix="MOTOR_COORDINATOR")
