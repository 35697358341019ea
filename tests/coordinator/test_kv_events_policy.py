"""The kv_events policy (pure): longest held prefix per the index, combined with load; ring
fallback when it cannot know."""

from __future__ import annotations

from motor_common.domain import Role
from motor_common.kv_events import BlockRemoved, BlockStored, EventBatch, vllm_event_hashes
from motor_coordinator.config import SchedulerConfig
from motor_coordinator.kv_index import KvIndex
from motor_coordinator.policies.base import (
    Candidate,
    EngineLoad,
    Policy,
    PrefillChoice,
    RequestInfo,
)
from motor_coordinator.policies.kv_events import BlockHashing, KvEvents
from motor_coordinator.policies.prefix_aware import PrefixAware
from tests.coordinator.factories import inst

SYSTEM = list(range(1000, 1064))  # 4 blocks of 16
PROMPT = [*SYSTEM, *range(5, 40)]  # + 2 full blocks of user text


def cands(n: int, running: list[float] | None = None, queued: list[int] | None = None) -> list[Candidate]:
    out = []
    for i in range(n):
        x = inst(i + 1)
        out.append(Candidate(x, x.endpoints[0], 0, EngineLoad(running=running[i]) if running else None,
                             queued[i] if queued else 0))
    return out


def setup(n: int = 3) -> tuple[KvIndex, KvEvents, list[Candidate]]:
    index = KvIndex()
    c = cands(n)
    for x in c:
        index.add_engine(x.key, "m")
        index.apply(x.key, 0, EventBatch(0.0, ()))  # a live, empty stream
    return index, KvEvents(SchedulerConfig(), index, BlockHashing(block_size=16)), c


def hold(index: KvIndex, key: str, tokens: list[int], seq: int = 1) -> None:
    index.apply(key, seq, EventBatch(0.0, (BlockStored(tuple(vllm_event_hashes(tokens, 16)), None, (), 16),)))


def req(seq: int = 0, ids: list[int] | None = None) -> RequestInfo:
    return RequestInfo(seq, "m", "some prefix", None if ids is None else tuple(ids))


def test_goes_to_the_engine_holding_the_longest_prefix() -> None:
    index, p, c = setup()
    hold(index, c[1].key, SYSTEM)  # 4 blocks
    hold(index, c[2].key, PROMPT)  # all 6
    assert p.select(Role.PREFILL, c, req(0, PROMPT)) is c[2]
    assert p.select(Role.PREFILL, c, req(0, [*SYSTEM, *range(900, 940)])) is c[1]  # same system prompt
    assert p.fallbacks == 0


def live(index: KvIndex, c: list[Candidate]) -> None:
    for x in c:
        index.add_engine(x.key, "m")
        index.apply(x.key, 0, EventBatch(0.0, ()))


def test_the_holders_queue_outweighs_its_hit_once_it_costs_more_than_twice_computing_the_prompt_elsewhere() -> None:
    index = KvIndex()
    p = KvEvents(SchedulerConfig(), index)
    assert len(PROMPT) == 99  # the holder computes 3 tokens (6 blocks held), any other engine 99
    c = cands(3, queued=[0, 0, 191])
    live(index, c)
    hold(index, c[2].key, PROMPT)
    assert p.select_prefill(c, req(0, PROMPT)) == PrefillChoice(c[2], 3)  # 191 + 2 x 3 < 0 + 2 x 99
    c = cands(3, queued=[0, 0, 193])
    assert p.select_prefill(c, req(0, PROMPT)) == PrefillChoice(c[0], 99)  # 193 + 2 x 3 > 0 + 2 x 99: spread
    c = cands(3, queued=[0, 40, 193])
    assert p.select_prefill(c, req(1, PROMPT)) == PrefillChoice(c[0], 99)  # the shorter queue of the others


def test_a_computed_token_weighs_twice_so_the_holder_keeps_a_chat_its_queue_would_finish_later() -> None:
    """Greedy finish-first (weight 1) would move the chat here: 97 + 3 > 0 + 99. Recomputing the
    prefix elsewhere is work left on that engine for the requests behind it and a second copy of
    the prefix in cache, so the holder keeps it until its queue outweighs twice the computation."""
    index = KvIndex()
    p = KvEvents(SchedulerConfig(), index)
    c = cands(3, queued=[0, 0, 97])
    live(index, c)
    hold(index, c[2].key, PROMPT)
    assert p.select_prefill(c, req(0, PROMPT)) == PrefillChoice(c[2], 3)


def test_a_partial_hit_is_weighed_by_the_tokens_left_to_compute() -> None:
    index = KvIndex()
    p = KvEvents(SchedulerConfig(), index)
    c = cands(3, queued=[0, 63, 0])
    live(index, c)
    hold(index, c[1].key, SYSTEM)  # 64 of 99: computes 35: 63 + 2 x 35 = 133
    hold(index, c[2].key, SYSTEM[:32])  # 32 of 99: computes 67: 2 x 67 = 134
    assert p.select_prefill(c, req(0, PROMPT)) == PrefillChoice(c[1], 35)
    c = cands(3, queued=[0, 65, 0])  # 65 + 70 = 135 > 134
    assert p.select_prefill(c, req(0, PROMPT)) == PrefillChoice(c[2], 67)


def test_a_cold_prefix_goes_to_the_shortest_queue_and_the_whole_prompt_is_queued() -> None:
    index = KvIndex()
    p = KvEvents(SchedulerConfig(), index)
    c = cands(3, queued=[50, 20, 80])
    live(index, c)
    assert p.select_prefill(c, req(0, PROMPT)) == PrefillChoice(c[1], 99)
    assert p.cold == 1 and p.routed == 0


def test_evicted_blocks_stop_attracting() -> None:
    index, p, c = setup()
    hold(index, c[2].key, PROMPT)
    hold(index, c[1].key, SYSTEM[:16])  # only the first block
    assert p.select(Role.PREFILL, c, req(0, PROMPT)) is c[2]
    index.apply(c[2].key, 2, EventBatch(0.0, (BlockRemoved(tuple(vllm_event_hashes(PROMPT, 16)[:1])),)))
    # c[2] still holds blocks 1..5, but without block 0 its prefix is empty: c[1]'s one block wins
    assert p.select(Role.PREFILL, c, req(0, PROMPT)) is c[1]


def test_a_cold_prefix_goes_to_the_least_loaded_engine_ties_in_turn() -> None:
    index, _, _ = setup()
    c = cands(3, running=[2, 0, 0])
    for x in c:
        index.add_engine(x.key, "m")
        index.apply(x.key, 0, EventBatch(0.0, ()))
    hold(index, c[0].key, list(range(5000, 5032)))  # something else entirely
    p = KvEvents(SchedulerConfig(), index)
    got = [p.select(Role.PREFILL, c, RequestInfo(seq, "m", "same text", tuple(PROMPT))) for seq in range(4)]
    assert got == [c[1], c[2], c[1], c[2]]  # never the busy one, the idle two in turn
    assert p.cold == 4 and p.fallbacks == 0 and p.routed == 0


def test_sglang_candidates_are_hashed_the_sglang_way() -> None:
    from dataclasses import replace

    from motor_common.domain import EngineType
    from motor_common.kv_events import sglang_block_hashes

    index = KvIndex()
    c = [replace(x, instance=replace(x.instance, engine_type=EngineType.SGLANG)) for x in cands(2)]
    for x in c:
        index.add_engine(x.key, "m")
        index.apply(x.key, 0, EventBatch(0.0, ()))
    index.apply(c[1].key, 1, EventBatch(0.0, (BlockStored(tuple(sglang_block_hashes(PROMPT, 16)), None, (), 16),)))
    assert KvEvents(SchedulerConfig(), index).select(Role.PREFILL, c, req(0, PROMPT)) is c[1]


def test_falls_back_to_the_ring_without_token_ids_or_live_streams() -> None:
    index, p, c = setup()
    ring = PrefixAware(SchedulerConfig())
    assert p.select(Role.PREFILL, c, req(0, None)) is ring.select(Role.PREFILL, c, req())
    assert p.select(Role.PREFILL, c, req(0, list(range(10)))) is ring.select(Role.PREFILL, c, req())  # < 1 block
    for x in c:
        index.mark_stale(x.key)
    assert p.select(Role.PREFILL, c, req(0, PROMPT)) is ring.select(Role.PREFILL, c, req())
    assert p.select_prefill(c, req(0, PROMPT)).tokens == 99  # nothing known: the whole prompt is queued
    assert p.select_prefill(c, req(0, None)).tokens == 0  # no ids: no estimate
    assert p.fallbacks == 5


def test_decode_is_least_loaded() -> None:
    _, p, _ = setup()
    c = cands(2, running=[3, 1])
    assert p.select(Role.DECODE, c, req(0, PROMPT)) is c[1]


def test_is_a_policy() -> None:
    policy: Policy = KvEvents(SchedulerConfig(), KvIndex())  # mypy checks the Protocol
    assert policy.name == "kv_events"


def test_the_block_size_the_engines_report_wins_over_the_configured_one() -> None:
    index = KvIndex()
    p = KvEvents(SchedulerConfig(), index, BlockHashing(block_size=16))  # configured 16
    c = cands(2)
    live(index, c)
    index.apply(c[1].key, 1, EventBatch(0.0, (BlockStored(tuple(vllm_event_hashes(PROMPT, 32)), None, (), 32),)))
    assert index.block_size("m") == 32
    assert p.select_prefill(c, req(0, PROMPT)) == PrefillChoice(c[1], 99 - 96)  # 3 blocks of 32 held
    assert p.routed == 1


def test_a_prefill_that_stores_a_new_block_makes_the_index_expect_events_from_its_engine() -> None:
    now = [0.0]
    index = KvIndex(silence_timeout=5.0, clock=lambda: now[0])
    p = KvEvents(SchedulerConfig(), index, BlockHashing(block_size=16))
    c = cands(2, queued=[0, 1000])
    live(index, c)
    hold(index, c[1].key, PROMPT)
    assert p.select_prefill(c, req(0, PROMPT[:96])).candidate is c[0]  # cold there: 6 new blocks
    now[0] = 10.0
    assert index.is_stale(c[0].key) and not index.is_stale(c[1].key)
    c = cands(2)
    assert p.select_prefill(c, req(0, PROMPT)) == PrefillChoice(c[1], 3)  # < 1 block new: nothing expected
    now[0] = 100.0
    assert not index.is_stale(c[1].key)
