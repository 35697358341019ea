"""prefix_aware's consistent-hash ring and its use by the policy and the scheduler (no sockets)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from motor_common.domain import Role
from motor_coordinator.config import SchedulerConfig
from motor_coordinator.policies import Candidate, EngineLoad, RequestInfo, make_policy, prefix_ring
from motor_coordinator.policies.prefix_ring import HashRing, RingCache, prefix_point
from motor_coordinator.registry import RegistryState, set_instances
from motor_coordinator.scheduler import Scheduler, endpoint_key
from tests.coordinator.factories import inst

KEYS = [f"{i}/10.0.0.{i}:8000" for i in range(1, 11)]
PREFIXES = [f"system prompt {i}: you are a helpful assistant" for i in range(2000)]


def owners(keys: list[str], ring: HashRing | None = None) -> list[str]:
    view = (ring or HashRing(keys)).view(keys)
    assert view is not None
    return [keys[view.choose(prefix_point(p))] for p in PREFIXES]


def test_a_prefix_always_goes_to_the_same_key_whatever_the_key_order() -> None:
    first = owners(KEYS)
    assert owners(KEYS) == first
    shuffled = KEYS[:]
    random.Random(3).shuffle(shuffled)
    assert owners(shuffled) == first


def test_removing_a_key_moves_only_the_prefixes_it_owned() -> None:
    before = owners(KEYS)
    gone = KEYS[3]
    after = owners([k for k in KEYS if k != gone])
    moved = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert moved and all(before[i] == gone for i in moved)
    assert len(moved) == before.count(gone)


def test_adding_a_key_moves_prefixes_only_onto_the_new_key() -> None:
    before = owners(KEYS)
    after = owners([*KEYS, "11/10.0.0.11:8000"])
    moved = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert moved and all(after[i] == "11/10.0.0.11:8000" for i in moved)


def test_prefixes_spread_roughly_evenly_over_ten_keys() -> None:
    counts = Counter(owners(KEYS))
    mean = len(PREFIXES) / len(KEYS)
    assert set(counts) == set(KEYS)
    assert all(0.7 * mean <= c <= 1.3 * mean for c in counts.values()), counts


def test_a_superset_ring_answers_for_a_subset_exactly_as_a_ring_of_the_subset() -> None:
    rnd = random.Random(5)
    big = HashRing(KEYS)
    for _ in range(20):
        subset = rnd.sample(KEYS, rnd.randint(1, len(KEYS)))
        assert owners(subset, big) == owners(subset)


def test_an_extended_ring_answers_like_a_ring_built_from_scratch() -> None:
    base = HashRing(KEYS[:6])
    extended = HashRing(KEYS, base=base)
    assert extended.size == len(KEYS)
    assert owners(KEYS, extended) == owners(KEYS)


def test_the_cache_reuses_a_ring_for_a_shrunk_set_and_extends_it_for_a_grown_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hashed: list[str] = []
    real = prefix_ring.key_points
    monkeypatch.setattr(prefix_ring, "key_points", lambda k, v=prefix_ring.VNODES: hashed.append(k) or real(k, v))
    cache = RingCache()
    cache.view("m", KEYS[:8])
    assert sorted(hashed) == sorted(KEYS[:8])
    hashed.clear()
    cache.view("m", KEYS[:7])  # an endpoint left (breaker, retry exclusion): no new ring
    assert hashed == []
    cache.view("m", KEYS)  # two joined: only they are hashed
    assert sorted(hashed) == sorted(KEYS[8:])
    hashed.clear()
    cache.view("other model", KEYS[:2])  # another lineage has rings of its own
    assert sorted(hashed) == sorted(KEYS[:2])


# -- the policy and the scheduler -------------------------------------------------------------


def cands(n: int, inflight: list[int] | None = None) -> list[Candidate]:
    return [Candidate(x, x.endpoints[0], inflight[i] if inflight else 0) for i, x in enumerate(inst(i + 1) for i in range(n))]


def req(seq: int = 0, prefix: str = "") -> RequestInfo:
    return RequestInfo(seq, "m", prefix)


def sched(n_prefill: int = 10, n_decode: int = 3, slack: float = 4.0) -> Scheduler:
    instances = [inst(i + 1, Role.PREFILL) for i in range(n_prefill)]
    instances += [inst(100 + i, Role.DECODE) for i in range(n_decode)]
    s = Scheduler(make_policy(SchedulerConfig(policy="prefix_aware", prefix_load_slack=slack)), breaker_failures=1)
    s.accept(set_instances(RegistryState(), instances, 0))
    return s


def slow(s: Scheduler) -> Scheduler:
    """The same scheduler state routed through Policy.select over built candidates."""
    ref = Scheduler(make_policy(SchedulerConfig(policy="prefix_aware", prefix_load_slack=s.policy.slack)),  # type: ignore[attr-defined]
                    breaker_failures=1)
    ref.accept(s.state)
    ref._select_index = None
    return ref


def test_policy_sends_a_shared_prefix_to_one_prefill_and_spreads_different_ones() -> None:
    p = make_policy(SchedulerConfig(policy="prefix_aware"))
    c = cands(10)
    assert len({p.select(Role.PREFILL, c, req(s, PREFIXES[0])).instance.id for s in range(50)}) == 1
    assert len({p.select(Role.PREFILL, c, req(0, x)).instance.id for x in PREFIXES[:200]}) == 10
    s = sched()
    assert len({s.route(req(seq, PREFIXES[0])).prefill.instance.id for seq in range(50)}) == 1  # type: ignore[union-attr]
    assert s._live["m", Role.PREFILL].memos  # chosen on the indexed fast path, ring kept with the live set


def test_policy_removing_an_endpoint_moves_only_its_prefixes() -> None:
    p = make_policy(SchedulerConfig(policy="prefix_aware"))
    c = cands(10)
    before = [p.select(Role.PREFILL, c, req(0, x)).instance.id for x in PREFIXES]
    after = [p.select(Role.PREFILL, c[:4] + c[5:], req(0, x)).instance.id for x in PREFIXES]
    assert all(a == b or a == 5 for a, b in zip(before, after, strict=True))
    assert 5 not in after and before.count(5) > 0


def test_select_and_select_index_agree_through_breakers_and_new_endpoints() -> None:
    fast = sched()
    ref = slow(fast)
    for round_ in range(4):
        for seq, x in enumerate(PREFIXES[:300]):
            a, b = fast.route(req(seq, x)), ref.route(req(seq, x))
            assert (a.prefill, a.decode) == (b.prefill, b.decode)
        for s in (fast, ref):
            if round_ == 0:  # a breaker opens: the live set shrinks
                s.record_failure(s.state.instances[3].endpoints[0])
            elif round_ == 1:  # an endpoint joins
                s.accept(set_instances(s.state, [*s.state.instances.values(), inst(11, Role.PREFILL)], 0))
            elif round_ == 2:  # and one leaves
                s.accept(set_instances(s.state, [i for i in s.state.instances.values() if i.id != 7], 0))


def test_route_follows_the_ring_with_a_breaker_open_on_another_prefill() -> None:
    s = sched()
    before = {x: s.route(req(0, x)).prefill.instance.id for x in PREFIXES[:300]}  # type: ignore[union-attr]
    s.record_failure(s.state.instances[2].endpoints[0])
    after = {x: s.route(req(0, x)).prefill.instance.id for x in PREFIXES[:300]}  # type: ignore[union-attr]
    assert all(after[x] == before[x] for x in before if before[x] != 2)
    assert 2 not in after.values()


@pytest.mark.parametrize("fast", [True, False])
def test_load_guard_falls_back_to_the_least_loaded_prefill(fast: bool) -> None:
    s = sched(n_prefill=4, slack=2)
    if not fast:
        s = slow(s)
    x = PREFIXES[0]
    preferred = s.route(req(0, x)).prefill
    assert preferred is not None
    key = endpoint_key(preferred.endpoint)
    s.set_load(key, EngineLoad(running=2))  # within the slack: stays
    assert s.route(req(0, x)).prefill.instance.id == preferred.instance.id  # type: ignore[union-attr]
    for other in (1, 2, 3, 4):
        if other != preferred.instance.id:
            s.set_load(endpoint_key(s.state.instances[other].endpoints[0]), EngineLoad(running=other))
    s.set_load(key, EngineLoad(running=10))  # beyond it: the least loaded (lowest id left) wins
    least = min(i for i in (1, 2, 3, 4) if i != preferred.instance.id)
    assert s.route(req(0, x)).prefill.instance.id == least  # type: ignore[union-attr]


@pytest.mark.parametrize("fast", [True, False])
def test_decode_and_prompts_without_text_use_least_load(fast: bool) -> None:
    s = sched(n_prefill=3, n_decode=3)
    if not fast:
        s = slow(s)
    for iid, running in ((100, 3), (101, 0), (102, 5), (1, 2), (2, 1), (3, 0)):
        s.set_load(endpoint_key(s.state.instances[iid].endpoints[0]), EngineLoad(running=running))
    for seq, x in enumerate(PREFIXES[:50]):
        assert s.route(req(seq, x)).decode.instance.id == 101  # type: ignore[union-attr]
    assert s.route(req(0, "")).prefill.instance.id == 3  # type: ignore[union-attr]
