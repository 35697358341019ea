"""Unit tests of the pure simulator parts: no sockets, no processes."""

from __future__ import annotations

import asyncio

import pytest

from motor_common import toy_tokenizer as tokenizer
from motor_sim.costmodel import CostModel
from motor_sim.faults import FaultMode, InvalidFault, parse_fault
from motor_sim.generator import (
    Decoder,
    SamplingKey,
    f32,
    logprob_of,
    sequence_digest,
    token_at,
    token_text,
    top_alternatives,
)
from motor_sim.kvcache import BlockManager, NoFreeBlocks, block_hashes
from motor_sim.kvtransfer import KVPayload, Lease, LeaseTable, RoomTable, TransferError
from motor_sim.params import InvalidRequest, parse
from motor_sim.scheduler import Engine


def test_tokenizer_is_deterministic_and_splits_words_and_punctuation() -> None:
    assert tokenizer.encode("Hello, world!") == tokenizer.encode("Hello, world!")
    assert len(tokenizer.encode("Hello, world!")) == 4
    assert tokenizer.encode("") == []


def test_chat_template_renders_roles_and_generation_prompt() -> None:
    text = tokenizer.render_chat([{"role": "system", "content": "be brief"},
                                  {"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert text == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    with pytest.raises(ValueError):
        tokenizer.render_chat([{"content": "no role"}])


def _decoder(max_tokens: int = 8, stop: tuple[str, ...] = (), seed: int = 0,
             first: int | None = None) -> Decoder:
    digest = sequence_digest("m", tokenizer.encode("a prompt"), SamplingKey(seed=seed))
    return Decoder(digest, 0, max_tokens, stop, first_token=first)


def _run(d: Decoder) -> str:
    out = ""
    while not d.finished:
        out += d.step().text
    return out


def test_generator_same_inputs_same_text_and_seed_changes_it() -> None:
    a, b, c = _run(_decoder()), _run(_decoder()), _run(_decoder(seed=1))
    assert a == b
    assert a != c
    assert len(a.split()) == 8


def test_generator_token_is_a_pure_function_of_the_context() -> None:
    ctx = sequence_digest("m", [1, 2, 3], SamplingKey())
    assert token_at(ctx, 0) == token_at(sequence_digest("m", [1, 2, 3], SamplingKey()), 0)
    assert ctx.advance(7) == sequence_digest("m", [1, 2, 3, 7], SamplingKey())


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_continuation_of_prompt_plus_generated_text_yields_the_remaining_tokens(temperature: float) -> None:
    """Mid-stream migration: prompt + the text already sent, re-prefilled, continues exactly."""
    key = SamplingKey(seed=5, temperature=temperature)
    prompt = "Tell me, please: a story"
    whole = Decoder(sequence_digest("m", tokenizer.encode(prompt), key), 0, 12)
    text = _run(whole)
    for k in (1, 5, 11):
        sent = "".join(" " + w for w in text.split()[:k])
        cont = Decoder(sequence_digest("m", tokenizer.encode(prompt + sent), key), 0, 12 - k)
        assert sent + _run(cont) == text
    # chat: the partial assistant message, rendered without a generation prompt
    msgs = [{"role": "user", "content": "hi"}]
    whole = Decoder(sequence_digest("m", tokenizer.encode(tokenizer.render_chat(msgs)), key), 0, 8)
    text = _run(whole)
    sent = "".join(" " + w for w in text.split()[:3])
    partial = [*msgs, {"role": "assistant", "content": sent}]
    rendered = tokenizer.render_chat(partial, add_generation_prompt=False, continue_final_message=True)
    cont = Decoder(sequence_digest("m", tokenizer.encode(rendered), key), 0, 5)
    assert sent + _run(cont) == text


def test_sampling_parameters_count_as_float32_like_a_real_engine() -> None:
    """A router that re-sends temperature 0.8 as its float32 value (0.800000011920929) gets the
    same sampled text; a genuinely different temperature does not."""
    ids = tokenizer.encode("a prompt")
    exact = sequence_digest("m", ids, SamplingKey(seed=3, temperature=0.8, top_p=0.9))
    widened = sequence_digest("m", ids, SamplingKey(seed=3, temperature=0.800000011920929,
                                                     top_p=0.8999999761581421))
    other = sequence_digest("m", ids, SamplingKey(seed=3, temperature=0.81, top_p=0.9))
    assert exact == widened != other


def test_logprobs_are_float32_values() -> None:
    ctx = sequence_digest("m", [1, 2, 3], SamplingKey())
    for pos in range(20):
        ctx = ctx.advance(pos)
        lp = logprob_of(ctx, 0)
        assert f32(lp) == lp and -4.0 < lp <= -0.01
        alts = top_alternatives(ctx, 0, 5)
        assert all(f32(v) == v for _, v in alts)
        assert [v for _, v in alts] == sorted((v for _, v in alts), reverse=True)


def test_generated_words_retokenize_to_their_ids() -> None:
    d = _decoder()
    _run(d)
    assert tokenizer.encode(d.text) == d.token_ids


def test_stop_string_truncates_text_and_streamed_text_never_leaks_it() -> None:
    full = _run(_decoder(max_tokens=8))
    words = full.split()
    stop = words[3] + " " + words[4]
    d = _decoder(max_tokens=8, stop=(stop,))
    streamed = _run(d)
    assert d.finish_reason == "stop" and d.stop_reason == stop
    assert streamed == d.text == full[: full.index(stop)]
    assert len(d.token_ids) == 5


def test_max_tokens_gives_finish_reason_length() -> None:
    d = _decoder(max_tokens=3)
    _run(d)
    assert d.finish_reason == "length" and len(d.token_ids) == 3


def test_remote_first_token_is_used_then_generation_continues() -> None:
    plain = _decoder(max_tokens=4)
    _run(plain)
    remote = _decoder(max_tokens=4, first=plain.token_ids[0])
    _run(remote)
    assert remote.token_ids == plain.token_ids
    assert token_text(plain.token_ids[0]).startswith(" ")


def test_prefix_cache_reuses_full_blocks_and_counts_hits() -> None:
    bm = BlockManager(num_blocks=64, block_size=16)
    prompt = list(range(40))  # 2 full blocks + 8 tokens
    a = bm.allocate("a", prompt, 48)
    assert a.cached_tokens == 0
    bm.free("a")
    b = bm.allocate("b", prompt, 48)
    assert b.cached_tokens == 32
    assert bm.prefix_queries == 80 and bm.prefix_hits == 32
    assert b.block_ids[:2] == a.block_ids[:2]


def test_fully_cached_prompt_still_recomputes_its_last_token() -> None:
    bm = BlockManager(num_blocks=8, block_size=16)
    prompt = list(range(32))
    bm.allocate("a", prompt, 32)
    bm.free("a")
    assert bm.allocate("b", prompt, 32).cached_tokens == 16


def test_block_budget_is_enforced_and_free_returns_blocks() -> None:
    bm = BlockManager(num_blocks=4, block_size=16)
    bm.allocate("a", list(range(10)), 48)
    assert bm.num_used == 3 and bm.usage == 0.75
    with pytest.raises(NoFreeBlocks):
        bm.allocate("b", list(range(100, 110)), 32)
    assert bm.free("a") and not bm.free("a")
    assert bm.num_used == 0


def test_evicted_block_loses_its_prefix_hash() -> None:
    bm = BlockManager(num_blocks=2, block_size=4)
    p1 = [1, 2, 3, 4, 5]
    bm.allocate("a", p1, 8)
    bm.free("a")
    assert bm.evicted_blocks == 0
    bm.allocate("b", [9, 9, 9, 9, 9], 8)  # reuses both free blocks, evicting p1's hash
    assert bm.evicted_blocks == 1  # one full (hashed) block; the partial one held no hash
    bm.free("b")
    assert bm.allocate("c", p1, 8).cached_tokens == 0
    assert bm.evicted_blocks == 2
    assert block_hashes(p1, 4) == block_hashes(p1, 4)


def test_cost_model_prefill_grows_with_uncached_tokens_and_decode_with_batch() -> None:
    cm = CostModel(prefill_base_ms=1, prefill_ms_per_token=0.1, decode_ms_per_token=2,
                   decode_ms_per_seq=1)
    assert cm.prefill_s(100) > cm.prefill_s(10)
    assert cm.decode_interval_s(8) > cm.decode_interval_s(1)
    assert cm.slowed(10).decode_interval_s(1) == pytest.approx(10 * cm.decode_interval_s(1))
    zero = CostModel(zero_latency=True)
    assert zero.prefill_s(10_000) == zero.decode_interval_s(100) == zero.transfer_s(9) == 0


async def test_engine_bounds_running_batch_and_queues_the_rest_fifo() -> None:
    eng = Engine(BlockManager(64, 16), CostModel(zero_latency=True), max_num_seqs=1)
    await eng.admit("a", [1, 2], 4)
    waiter = asyncio.create_task(eng.admit("b", [3, 4], 4))
    await asyncio.sleep(0)
    assert eng.num_running == 1 and eng.num_waiting == 1
    eng.finish("a")
    await waiter
    assert eng.running == {"b"} and eng.num_waiting == 0


@pytest.mark.parametrize(("slots", "at_once"), [(1, 1), (2, 2), (0, 3)])
async def test_prefill_slots_bound_the_prefills_that_compute_at_once(slots: int, at_once: int) -> None:
    # an hour per prefill: nothing finishes by itself; slots=0 is the old unbounded engine
    eng = Engine(BlockManager(64, 16), CostModel(prefill_base_ms=3_600_000, prefill_slots=slots), max_num_seqs=8)
    tasks = [asyncio.create_task(eng.prefill(100)) for _ in range(3)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert eng.prefills_computing == at_once
    tasks[0].cancel()  # the first one ends: the next queued one (FIFO) computes
    for _ in range(5):
        await asyncio.sleep(0)
    assert eng.prefills_computing == min(at_once, 2)
    assert all(not t.done() for t in tasks[1:])
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert eng.prefills_computing == 0


async def test_cancelled_waiter_leaves_the_queue() -> None:
    eng = Engine(BlockManager(64, 16), CostModel(zero_latency=True), max_num_seqs=1)
    await eng.admit("a", [1], 2)
    waiter = asyncio.create_task(eng.admit("b", [2], 2))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    eng.finish("a")
    assert eng.num_running == 0 and eng.blocks.num_used == 0


def test_params_parse_completion_and_chat() -> None:
    job = parse({"prompt": "hi there", "max_tokens": 3, "stop": "x", "seed": 7, "n": 2}, "completion")
    assert job.prompt_ids == tuple(tokenizer.encode("hi there"))
    assert (job.max_tokens, job.stop, job.key.seed, job.n) == (3, ("x",), 7, 2)
    chat = parse({"messages": [{"role": "user", "content": "q"}], "max_completion_tokens": 4,
                  "logprobs": True, "top_logprobs": 2, "stream": True,
                  "stream_options": {"include_usage": True}}, "chat")
    assert chat.max_tokens == 4 and chat.logprobs == 2 and chat.include_usage


@pytest.mark.parametrize("body", [
    {"prompt": "x", "max_tokens": 0},
    {"prompt": "x", "n": "2"},
    {"prompt": 5},
    {"prompt": "x", "stream_options": {"include_usage": True}},
    {"prompt": "x", "temperature": -1},
    {"prompt": ["a", "b"]},
])
def test_params_reject_invalid_bodies(body: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest):
        parse(body, "completion")


def test_lease_table_hands_over_once_and_rejects_forged_or_expired() -> None:
    payload = KVPayload((1, 2), 3, "eng", 1)
    t = LeaseTable("eng")
    t.put(Lease("r1", (5,), payload, expires_at=10.0))
    with pytest.raises(TransferError, match="engine id"):
        t.take("r1", "other", [5], now=0.0)
    with pytest.raises(TransferError, match="block ids"):
        t.take("r1", "eng", [6], now=0.0)
    assert t.take("r1", "eng", [5], now=0.0).payload == payload
    with pytest.raises(TransferError, match="no KV blocks"):
        t.take("r1", "eng", [5], now=0.0)
    t.put(Lease("r2", (5,), payload, expires_at=1.0))
    assert [lease.request_id for lease in t.expire(now=2.0)] == ["r2"]
    assert KVPayload.from_wire(payload.to_wire()) == payload


async def test_room_table_either_side_may_arrive_first() -> None:
    rooms = RoomTable()
    payload = KVPayload((1,), 2, "p", 1)
    taker = asyncio.create_task(rooms.take(7, 1.0))
    await asyncio.sleep(0)
    await rooms.publish(7, payload, 1.0)
    assert await taker == payload
    pub = asyncio.create_task(rooms.publish(8, payload, 1.0))
    await asyncio.sleep(0)
    assert await rooms.take(8, 1.0) == payload
    await pub
    assert len(rooms) == 0


async def test_room_table_times_out_both_ways() -> None:
    rooms = RoomTable()
    with pytest.raises(TransferError, match="timed out"):
        await rooms.take(1, 0.01)
    with pytest.raises(TransferError, match="Decode instance could be dead"):
        await rooms.publish(2, KVPayload((1,), 2, "p", 1), 0.01)
    assert len(rooms) == 0


def test_fault_parsing_validates_modes_and_fields() -> None:
    assert parse_fault({"mode": "slow", "factor": 3}).mode is FaultMode.SLOW
    assert parse_fault({"mode": "crash"}).health_status == "dead"
    slow_health = parse_fault({"mode": "slow_health", "delay_s": 0.6})
    assert (slow_health.mode, slow_health.delay_s, slow_health.health_status) == (FaultMode.SLOW_HEALTH, 0.6, "healthy")
    for bad in ({"mode": "explode"}, {"mode": "crash", "exit_code": 0}, {"mode": "none", "x": 1},
                {"mode": "refuse_start"}, {"mode": "slow_health", "delay_s": -1},
                {"mode": "slow_health", "delay_s": 3601}):
        with pytest.raises(InvalidFault):
            parse_fault(bad)


def test_top_alternatives_never_asks_for_more_than_the_vocabulary() -> None:
    from motor_sim.generator import VOCAB, top_alternatives
    d = sequence_digest("m", [1], SamplingKey())
    # k = 1000 used to loop for ever (373 distinct words); -1 is the whole vocabulary
    assert len(top_alternatives(d, 0, 1000)) == len(VOCAB)
    assert len({t for t, _ in top_alternatives(d, 0, -1)}) == len(VOCAB)
    assert len(top_alternatives(d, 0, 5)) == 5

