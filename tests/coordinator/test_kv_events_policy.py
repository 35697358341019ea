"""The kv_events policy (pure): longest held prefix per the index, combined with load; ring
fallback when it cannot know."""

from __future__ import annotations

from motor_common.domain import Role
from motor_common.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    vllm_event_hashes,
)
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
    index = KvIndex(pending_ttl=0)  # the cost alone: no blocks pending from the choices before
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
    index = KvIndex(pending_ttl=0)  # the cost alone: no blocks pending from the choices before
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
    # four different cold prompts (a repeated one would follow its first copy: pending blocks)
    prompts = [tuple(range(20_000 + 100 * seq, 20_099 + 100 * seq)) for seq in range(4)]
    got = [p.select(Role.PREFILL, c, RequestInfo(seq, "m", "same text", prompts[seq])) for seq in range(4)]
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


def test_a_second_same_prefix_request_before_the_events_follows_the_first() -> None:
    """The first request's blocks are pending on its engine until BlockStored: a new chat with the
    same system prompt sent meanwhile goes there instead of computing the prefix on an idle one."""
    now = [0.0]
    index = KvIndex(clock=lambda: now[0], pending_ttl=5.0)
    p = KvEvents(SchedulerConfig(), index, BlockHashing(block_size=16))
    c = cands(3)
    live(index, c)
    assert p.select_prefill(c, req(0, PROMPT)) == PrefillChoice(c[0], 99)  # cold: in turn
    assert index.pending_count(c[0].key) == 6
    c = cands(3, queued=[99, 0, 0])  # the first prefill is still queued there
    other = [*SYSTEM, *range(700, 735)]  # same 4 system blocks, another user text
    # c[0]: 99 + 2 x 35 = 169 against 0 + 2 x 99 = 198 elsewhere
    assert p.select_prefill(c, req(1, other)) == PrefillChoice(c[0], 35)
    assert p.routed == 1 and p.cold == 1
    # the engine reports the blocks stored: they are held, no longer pending, and still attract
    hold(index, c[0].key, PROMPT)
    assert index.pending_count(c[0].key) == 2  # the other chat's own 2 blocks
    assert p.select_prefill(c, req(2, other)).candidate is c[0]


def test_without_pending_blocks_the_second_request_would_compute_the_prefix_elsewhere() -> None:
    index = KvIndex(pending_ttl=0)  # pending off: the behaviour before
    p = KvEvents(SchedulerConfig(), index, BlockHashing(block_size=16))
    c = cands(3)
    live(index, c)
    assert p.select_prefill(c, req(0, PROMPT)).candidate is c[0]
    c = cands(3, queued=[99, 0, 0])
    assert p.select_prefill(c, req(0, [*SYSTEM, *range(700, 735)])) == PrefillChoice(c[1], 99)


def test_pending_blocks_expire_after_the_ttl() -> None:
    now = [0.0]
    index = KvIndex(clock=lambda: now[0], pending_ttl=5.0)
    p = KvEvents(SchedulerConfig(), index, BlockHashing(block_size=16))
    c = cands(3)
    live(index, c)
    assert p.select_prefill(c, req(0, PROMPT)).candidate is c[0]
    now[0] = 4.9
    assert index.pending_count(c[0].key) == 6
    assert index.prefix_lengths("m", vllm_event_hashes(PROMPT, 16), [x.key for x in c])[c[0].key] == 6
    now[0] = 5.0  # no BlockStored came (the prefill failed, or its blocks were evicted at once)
    c = cands(3, queued=[99, 0, 0])
    assert p.select_prefill(c, req(0, PROMPT)) == PrefillChoice(c[1], 99)  # cold again: shortest queue
    assert index.pending_count(c[0].key) == 0 and index.pending_count(c[1].key) == 6


def test_a_reset_engine_or_a_stale_stream_loses_its_pending_blocks() -> None:
    index, p, c = setup()
    hashes = vllm_event_hashes(PROMPT, 16)
    keys = [x.key for x in c]
    assert p.select_prefill(c, req(0, PROMPT)).candidate is c[0]
    assert index.prefix_lengths("m", hashes, keys) == {keys[0]: 6, keys[1]: 0, keys[2]: 0}
    index.apply(c[0].key, 1, EventBatch(0.0, (AllBlocksCleared(),)))
    assert index.pending_count(c[0].key) == 0
    assert index.prefix_lengths("m", hashes, keys)[keys[0]] == 0
    index.add_pending(c[1].key, hashes)
    index.apply(c[1].key, 0, EventBatch(0.0, ()))  # seq 0 again: the engine restarted
    assert index.pending_count(c[1].key) == 0
    index.add_pending(c[2].key, hashes)
    index.mark_stale(c[2].key)
    index.mark_live(c[2].key)
    assert index.pending_count(c[2].key) == 0
    assert index.prefix_lengths("m", hashes, keys) == dict.fromkeys(keys, 0)
    index.add_pending(c[2].key, hashes)
    index.remove_engine(c[2].key)
    index.add_engine(c[2].key, "m")
    index.apply(c[2].key, 0, EventBatch(0.0, ()))
    assert index.pending_count(c[2].key) == 0
    assert index.prefix_lengths("m", hashes, keys) == dict.fromkeys(keys, 0)


def test_pending_blocks_are_bounded_per_engine_oldest_dropped_first() -> None:
    index = KvIndex(max_pending_per_engine=10)
    index.add_engine("e", "m")
    index.apply("e", 0, EventBatch(0.0, ()))
    first = vllm_event_hashes(list(range(0, 160)), 16)  # 10 blocks
    second = vllm_event_hashes(list(range(1000, 1064)), 16)  # 4 more
    index.add_pending("e", first)
    index.add_pending("e", second)
    assert index.pending_count("e") == 10
    assert index.prefix_lengths("m", second, ["e"]) == {"e": 4}
    assert index.prefix_lengths("m", first, ["e"]) == {"e": 0}  # its first 4 blocks were dropped
    assert index.prefix_lengths("m", first[4:], ["e"]) == {"e": 6}
    # already held blocks are not pending again
    index.apply("e", 1, EventBatch(0.0, (BlockStored(tuple(second), None, (), 16),)))
    assert index.pending_count("e") == 6
    index.add_pending("e", second)
    assert index.pending_count("e") == 6
