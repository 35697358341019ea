"""The KV-event index (pure): sequence numbers, gaps, restarts, clears, memory bound, lookup."""

from __future__ import annotations

import pytest

from motor_common.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from motor_coordinator.kv_index import Applied, Duplicate, Gap, KvIndex


def stored(*hashes: int) -> EventBatch:
    return EventBatch(0.0, (BlockStored(tuple(hashes), None, (), 16),))


def removed(*hashes: int) -> EventBatch:
    return EventBatch(0.0, (BlockRemoved(tuple(hashes)),))


CLEARED = EventBatch(0.0, (AllBlocksCleared(),))


def idx(*engines: str, model: str = "m", cap: int = 1000) -> KvIndex:
    i = KvIndex(cap)
    for e in engines:
        i.add_engine(e, model)
    return i


def test_longest_prefix_per_engine() -> None:
    i = idx("a", "b", "c")
    assert i.apply("a", 0, stored(1, 2, 3)) == Applied()
    assert i.apply("b", 0, stored(1, 2)) == Applied()
    i.apply("c", 0, stored(2, 3))  # holds later blocks but not the first: no prefix
    assert i.prefix_lengths("m", [1, 2, 3, 4], ["a", "b", "c"]) == {"a": 3, "b": 2, "c": 0}
    assert i.prefix_lengths("m", [9, 1], ["a", "b"]) == {"a": 0, "b": 0}


def test_unknown_engines_and_models_hold_nothing() -> None:
    i = idx("a")
    i.apply("a", 0, stored(1))
    assert i.prefix_lengths("m", [1], ["a", "zz"]) == {"a": 1, "zz": 0}
    assert i.prefix_lengths("other", [1], ["a"]) == {"a": 0}


def test_models_do_not_mix() -> None:
    i = KvIndex()
    i.add_engine("a", "m1")
    i.add_engine("b", "m2")
    i.apply("a", 0, stored(1))
    i.apply("b", 0, stored(1))
    assert i.prefix_lengths("m1", [1], ["a", "b"]) == {"a": 1, "b": 0}


def test_removed_and_cleared() -> None:
    i = idx("a")
    i.apply("a", 0, stored(1, 2, 3))
    i.apply("a", 1, removed(2, 99))  # 99 was never stored: ignored
    assert i.prefix_lengths("m", [1, 2, 3], ["a"]) == {"a": 1}
    i.apply("a", 2, CLEARED)
    assert i.prefix_lengths("m", [1], ["a"]) == {"a": 0}
    assert i.block_count("a") == 0


def test_duplicate_is_ignored() -> None:
    i = idx("a")
    i.apply("a", 0, stored(1))
    i.apply("a", 1, removed(1))
    assert (
        i.apply("a", 0, stored(1), replayed=True) == Duplicate()
    )  # a replayed old batch must not resurrect 1
    assert i.prefix_lengths("m", [1], ["a"]) == {"a": 0}
    assert i.last_seq("a") == 1


def test_gap_marks_stale_until_replayed() -> None:
    i = idx("a")
    i.apply("a", 0, stored(1))
    assert i.apply("a", 3, stored(2)) == Gap(1)
    assert i.is_stale("a")
    assert i.prefix_lengths("m", [1], ["a"]) == {"a": 0}  # stale: trust nothing
    # the replay fills 1, 2 then 3 arrives again
    assert i.apply("a", 1, stored(2), replayed=True) == Applied()
    i.apply("a", 2, stored(3), replayed=True)
    assert i.apply("a", 3, stored(4), replayed=True) == Applied()
    assert i.apply("a", 3, stored(4)) == Duplicate()  # live batch queued during the replay
    assert not i.is_stale("a")
    assert i.prefix_lengths("m", [1, 2, 3, 4], ["a"]) == {"a": 4}


def test_resync_when_replay_cannot_fill() -> None:
    i = idx("a")
    i.apply("a", 0, stored(1))
    assert isinstance(i.apply("a", 50, stored(2)), Gap)
    i.resync("a", 50)
    assert not i.is_stale("a") and i.block_count("a") == 0
    assert i.apply("a", 50, stored(2)) == Applied()
    assert i.prefix_lengths("m", [2], ["a"]) == {"a": 1}


def test_engine_restart_resets_its_blocks() -> None:
    i = idx("a", "b")
    i.apply("a", 0, stored(1, 2))
    i.apply("a", 1, stored(3))
    i.apply("b", 0, stored(1))
    assert i.apply("a", 0, stored(7)) == Applied()  # publisher restarted at 0
    assert i.restarts("a") == 1
    assert i.prefix_lengths("m", [1, 2], ["a", "b"]) == {"a": 0, "b": 1}
    assert i.prefix_lengths("m", [7], ["a"]) == {"a": 1}


def test_replayed_zero_is_not_a_restart() -> None:
    i = idx("a")
    i.apply("a", 0, stored(1))
    i.apply("a", 1, stored(2))
    assert i.apply("a", 0, stored(1), replayed=True) == Duplicate()
    assert i.restarts("a") == 0 and i.block_count("a") == 2


def test_remove_engine_forgets_it() -> None:
    i = idx("a", "b")
    i.apply("a", 0, stored(1))
    i.apply("b", 0, stored(1))
    i.remove_engine("a")
    assert i.prefix_lengths("m", [1], ["a", "b"]) == {"a": 0, "b": 1}
    with pytest.raises(KeyError):
        i.apply("a", 1, stored(1))


def test_mark_stale_and_first_batch() -> None:
    i = idx("a")
    assert i.is_stale("a")  # nothing heard yet
    i.apply("a", 7, stored(1))  # joining a running stream: accepted from where it is
    assert not i.is_stale("a")
    i.mark_stale("a")
    assert i.prefix_lengths("m", [1], ["a"]) == {"a": 0}


def test_memory_bound_drops_least_recently_stored() -> None:
    i = idx("a", cap=3)
    i.apply("a", 0, stored(1, 2, 3))
    i.apply("a", 1, stored(1))  # 1 refreshed
    i.apply("a", 2, stored(4))  # evicts 2, the least recent
    assert i.block_count("a") == 3
    assert i.prefix_lengths("m", [1], ["a"]) == {"a": 1}
    assert i.prefix_lengths("m", [1, 2], ["a"]) == {"a": 1}
    assert i.prefix_lengths("m", [4], ["a"]) == {"a": 1}


def test_holders_map_is_cleaned_up() -> None:
    i = idx("a")
    for s in range(100):
        i.apply("a", s, stored(s) if s % 2 == 0 else removed(s - 1))
    assert i.block_count("a") == 0
    assert i._holders["m"] == {}


def test_bad_cap() -> None:
    with pytest.raises(ValueError):
        KvIndex(0)


def test_restarted_forgets_blocks_and_accepts_any_next_seq() -> None:
    i = idx("a")
    i.apply("a", 0, stored(1))
    i.apply("a", 1, stored(2))
    i.restarted("a")
    assert i.restarts("a") == 1 and i.block_count("a") == 0 and i.is_stale("a")
    assert i.apply("a", 0, stored(3), replayed=True) == Applied()
    assert i.prefix_lengths("m", [3], ["a"]) == {"a": 1}


def test_a_live_copy_of_a_replayed_batch_0_is_a_duplicate_not_a_restart() -> None:

    index = KvIndex()
    index.add_engine("e", "m")
    batch = EventBatch(0.0, (BlockStored((1, 2), None, (), 16),))
    assert isinstance(index.apply("e", 0, batch, replayed=True), Applied)
    assert isinstance(index.apply("e", 0, batch), Duplicate)  # queued live while the replay ran
    assert index.restarts("e") == 0 and index.block_count("e") == 2
    assert isinstance(index.apply("e", 1, EventBatch(0.0, ())), Applied)
    assert isinstance(index.apply("e", 0, batch), Applied)  # live 0 after live 1: a restart
    assert index.restarts("e") == 1


def test_a_publisher_silent_after_a_prefill_was_sent_turns_stale_until_it_speaks() -> None:
    now = [100.0]
    i = KvIndex(1000, silence_timeout=5.0, clock=lambda: now[0])
    i.add_engine("a", "m")
    i.add_engine("b", "m")
    i.apply("a", 0, stored(1, 2))
    i.apply("b", 0, stored(1))
    now[0] += 60  # idle: silence proves nothing
    assert not i.is_stale("a")
    i.expect_events("a")
    now[0] += 5.0
    assert not i.is_stale("a")  # not longer than the timeout yet
    i.expect_events("a")  # a second prefill does not move the deadline
    now[0] += 0.1
    assert i.is_stale("a") and not i.is_stale("b")
    assert i.prefix_lengths("m", [1, 2], ["a", "b"]) == {"a": 0, "b": 1}  # holds nothing meanwhile
    assert i.apply("a", 1, stored(3)) == Applied()  # it speaks: trusted again, blocks kept
    assert not i.is_stale("a")
    assert i.prefix_lengths("m", [1, 2, 3], ["a", "b"]) == {"a": 3, "b": 1}
    i.expect_events("b")
    now[0] += 6
    assert i.is_stale("b")
    i.mark_live("b")  # caught up after a reconnect's replay
    assert not i.is_stale("b")


def test_silence_never_counts_with_timeout_0_and_bad_timeouts_are_refused() -> None:
    now = [0.0]
    i = KvIndex(1000, clock=lambda: now[0])
    i.add_engine("a", "m")
    i.apply("a", 0, stored(1))
    i.expect_events("a")
    now[0] += 10_000
    assert not i.is_stale("a")
    with pytest.raises(ValueError, match="silence_timeout"):
        KvIndex(10, silence_timeout=-1)


def test_the_block_size_is_learned_per_model_from_block_stored() -> None:
    i = idx("a", "b")
    i.add_engine("c", "other")
    assert i.block_size("m") is None
    i.apply("a", 0, EventBatch(0.0, (BlockStored((1,), None, (), 32),)))
    i.apply("c", 0, EventBatch(0.0, (BlockStored((7,), None, (), 64),)))
    assert (i.block_size("m"), i.block_size("other")) == (32, 64)


def test_pending_blocks_count_as_held_with_the_stored_ones_until_stored_removed_or_expired() -> None:
    now = [0.0]
    i = KvIndex(1000, clock=lambda: now[0], pending_ttl=2.0)
    for e in ("a", "b"):
        i.add_engine(e, "m")
        i.apply(e, 0, stored(1))
    i.add_engine("x", "other")  # another model's engine: its pending blocks never mix
    i.apply("x", 0, EventBatch(0.0, ()))
    i.add_pending("x", [1, 2, 3, 4])
    i.add_pending("a", [1, 2, 3])  # 1 is held already: not pending
    assert i.pending_count("a") == 2
    assert i.prefix_lengths("m", [1, 2, 3, 4], ["a", "b", "x"]) == {"a": 3, "b": 1, "x": 0}
    assert i.prefix_lengths("other", [1, 2, 3, 4], ["x"]) == {"x": 4}
    i.apply("a", 1, stored(2))  # stored: held now, no longer pending
    i.apply("a", 2, removed(3))  # evicted: neither
    assert i.pending_count("a") == 0
    assert i.prefix_lengths("m", [1, 2, 3], ["a", "b"]) == {"a": 2, "b": 1}
    i.add_pending("b", [2])
    now[0] = 1.0
    i.add_pending("b", [3])
    now[0] = 2.0  # block 2 sent at 0 expires; block 3 sent at 1 stays until 3
    assert i.prefix_lengths("m", [1, 2], ["b"]) == {"b": 1}
    assert i.pending_count("b") == 1
    now[0] = 3.0
    assert i.pending_count("b") == 0
    assert i.prefix_lengths("other", [1, 2, 3, 4], ["x"]) == {"x": 0}  # x's, sent at 0, too


def test_pending_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="pending_ttl"):
        KvIndex(pending_ttl=-1)
    with pytest.raises(ValueError, match="max_pending_per_engine"):
        KvIndex(max_pending_per_engine=0)
    i = KvIndex(pending_ttl=0)  # off: nothing is remembered
    i.add_engine("a", "m")
    i.apply("a", 0, EventBatch(0.0, ()))
    i.add_pending("a", [1, 2])
    assert i.pending_count("a") == 0
    i.add_pending("unknown", [1])  # an engine not tracked: ignored
