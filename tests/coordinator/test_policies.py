"""Scheduling policies and the scheduler's routing, breakers and load accounting (no sockets)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from motor_common.domain import EngineType, InstanceStatus, Role
from motor_common.errors import ConfigError, NotFound, Unavailable
from motor_coordinator.breaker import Breaker
from motor_coordinator.config import SchedulerConfig
from motor_coordinator.policies import POLICIES, Candidate, EngineLoad, RequestInfo, make_policy
from motor_coordinator.policies.base import PrefillChoice
from motor_coordinator.registry import RegistryState, set_instances
from motor_coordinator.scheduler import Scheduler, endpoint_key
from tests.coordinator.factories import inst


def cands(n: int, loads: list[float] | None = None, inflight: list[int] | None = None) -> list[Candidate]:
    out = []
    for i in range(n):
        x = inst(i + 1)
        load = EngineLoad(running=loads[i]) if loads else None
        out.append(Candidate(x, x.endpoints[0], inflight[i] if inflight else 0, load))
    return out


def req(seq: int = 0, prefix: str = "") -> RequestInfo:
    return RequestInfo(seq, "m", prefix)


def test_unknown_policy_is_a_config_error_naming_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="least_load"):
        make_policy(SchedulerConfig(policy="fastest"))
    assert set(POLICIES) == {"round_robin", "least_load", "prefix_aware", "kv_events"}


def test_round_robin_cycles_by_sequence_number() -> None:
    p = make_policy(SchedulerConfig(policy="round_robin"))
    c = cands(3)
    assert [p.select(Role.PREFILL, c, req(s)).instance.id for s in range(6)] == [1, 2, 3, 1, 2, 3]


def test_least_load_prefers_fewer_requests_counting_inflight_and_engine_gauges() -> None:
    p = make_policy(SchedulerConfig(policy="least_load"))
    assert p.select(Role.PREFILL, cands(3, inflight=[2, 0, 1]), req()).instance.id == 2
    assert p.select(Role.PREFILL, cands(3, loads=[5, 3, 4]), req()).instance.id == 2
    kv = [Candidate(c.instance, c.endpoint, 0, EngineLoad(kv_usage=u)) for c, u in zip(cands(2), [0.9, 0.1], strict=True)]
    assert p.select(Role.DECODE, kv, req()).instance.id == 2


def test_least_load_breaks_ties_round_robin() -> None:
    p = make_policy(SchedulerConfig(policy="least_load"))
    assert {p.select(Role.PREFILL, cands(2), req(s)).instance.id for s in range(2)} == {1, 2}


def test_prefix_aware_sends_a_shared_prefix_to_the_same_prefill() -> None:
    p = make_policy(SchedulerConfig(policy="prefix_aware"))
    c = cands(4)
    chosen = {p.select(Role.PREFILL, c, req(s, "You are a helpful assistant.")).instance.id for s in range(20)}
    assert len(chosen) == 1
    spread = {p.select(Role.PREFILL, c, req(0, f"prompt {i}")).instance.id for i in range(40)}
    assert len(spread) > 1


def test_prefix_aware_is_consistent_when_another_endpoint_leaves() -> None:
    p = make_policy(SchedulerConfig(policy="prefix_aware"))
    c = cands(4)
    first = p.select(Role.PREFILL, c, req(0, "abc")).instance.id
    rest = [x for x in c if x.instance.id != first and x.instance.id != (first % 4) + 1]
    rest.append(next(x for x in c if x.instance.id == first))
    assert p.select(Role.PREFILL, rest, req(0, "abc")).instance.id == first


def test_prefix_aware_load_guard_moves_off_an_overloaded_prefill() -> None:
    p = make_policy(SchedulerConfig(policy="prefix_aware", prefix_load_slack=2))
    c = cands(3)
    first = p.select(Role.PREFILL, c, req(0, "abc")).instance.id
    inflight = [10 if x.instance.id == first else 0 for x in c]
    assert p.select(Role.PREFILL, cands(3, inflight=inflight), req(0, "abc")).instance.id != first


def test_breaker_opens_after_n_failures_and_closes_only_on_a_probe_after_cooldown() -> None:
    b = Breaker(failures=2, cooldown=1.0)
    assert not b.record_failure(0.0)
    b.record_success()
    assert not b.record_failure(0.0)
    assert b.record_failure(0.1) and b.is_open
    b.record_success()
    assert b.is_open  # a request success does not close it
    assert not b.record_probe(True, 0.5) and b.is_open  # cooldown not over
    assert b.record_probe(True, 1.2) and not b.is_open
    assert not b.record_probe(False, 2.0)
    assert b.record_probe(False, 2.1) and b.is_open  # failing probes open it too


def sched(*instances: object, policy: str = "round_robin", failures: int = 2) -> tuple[Scheduler, list[float]]:
    now = [0.0]
    s = Scheduler(make_policy(SchedulerConfig(policy=policy)), breaker_failures=failures,
                  breaker_cooldown=1.0, clock=lambda: now[0])
    s.accept(set_instances(RegistryState(), list(instances), 0))  # type: ignore[arg-type]
    return s, now


def test_route_prefers_a_pd_pair_of_one_engine_type_else_union() -> None:
    s, _ = sched(inst(1, Role.PREFILL), inst(2, Role.DECODE), inst(3, Role.UNION))
    r = s.route(req())
    assert r.prefill and r.decode and r.prefill.instance.id == 1 and r.decode.instance.id == 2 and r.union is None
    s, _ = sched(inst(1, Role.PREFILL, engine=EngineType.SGLANG), inst(2, Role.DECODE), inst(3, Role.UNION))
    assert s.route(req()).union is not None


def test_route_errors_name_the_missing_role() -> None:
    s, _ = sched(inst(1, Role.PREFILL), inst(2, Role.DECODE, model="other"))
    with pytest.raises(Unavailable, match="no schedulable decode instance"):
        s.route(req())
    with pytest.raises(NotFound):
        s.route(RequestInfo(0, "nope"))
    s, _ = sched(inst(1, Role.UNION, status=InstanceStatus.PAUSED))
    with pytest.raises(Unavailable, match="union"):
        s.route(req())
    assert not s.has_schedulable_route()


def test_paused_and_broken_endpoints_are_not_scheduled_and_readiness_follows() -> None:
    s, now = sched(inst(1, Role.PREFILL), inst(2, Role.PREFILL), inst(3, Role.DECODE))
    changes: list[int] = []
    s.subscribe(lambda: changes.append(1))
    p1 = s.state.instances[1].endpoints[0]
    s.record_failure(p1)
    s.record_failure(p1)
    assert changes and s.instance_unavailable(s.state.instances[1])
    assert {s.route(req(i)).prefill.instance.id for i in range(4)} == {2}  # type: ignore[union-attr]
    s.record_failure(s.state.instances[2].endpoints[0])
    s.record_failure(s.state.instances[2].endpoints[0])
    assert not s.has_schedulable_route()
    with pytest.raises(Unavailable, match="prefill"):
        s.route(req())
    now[0] = 5.0
    s.record_probe(endpoint_key(p1), True)
    assert s.has_schedulable_route()


@pytest.mark.parametrize("policy", ["round_robin", "least_load", "prefix_aware"])
def test_with_no_prefill_schedulable_a_vllm_decode_takes_requests_whole_with_the_fallback_only(
        policy: str, caplog: pytest.LogCaptureFixture) -> None:
    """Prefills broken: decode-only routes to vLLM decodes (never SGLang's, which wait for a
    prefill's KV), readiness holds, one WARNING per outage; a prefill back: P/D again, one INFO."""
    def broken(s: Scheduler) -> None:
        for _ in range(2):
            s.record_failure(s.state.instances[1].endpoints[0])

    caplog.set_level(logging.INFO, logger="motor_coordinator.scheduler")
    s, now = sched(inst(1, Role.PREFILL), inst(2, Role.DECODE), inst(4, Role.DECODE, engine=EngineType.SGLANG),
                   policy=policy)
    s.decode_only_fallback = True
    broken(s)
    assert s.has_schedulable_route() and s.served_alone() == {"m": Role.DECODE}
    routes = [s.route(req(i, f"p{i}")) for i in range(6)]
    assert {(r.decode_only, r.prefill, r.union, r.engine) for r in routes} == {(True, None, None, EngineType.VLLM)}
    assert {r.decode.instance.id for r in routes} == {2}  # type: ignore[union-attr]
    warned = [r for r in caplog.records if "no prefill is schedulable for model 'm'" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelname == "WARNING"
    now[0] = 5.0
    s.record_probe(endpoint_key(s.state.instances[1].endpoints[0]), True)
    r = s.route(req(7))
    assert not r.decode_only and r.prefill.instance.id == 1  # type: ignore[union-attr]
    assert sum("schedulable again for model 'm'" in r.getMessage() for r in caplog.records) == 1

    s.decode_only_fallback = False  # the fallback off: the old refusal
    broken(s)
    assert not s.has_schedulable_route()
    with pytest.raises(Unavailable, match="no schedulable prefill instance"):
        s.route(req())
    s, _ = sched(inst(1, Role.PREFILL, engine=EngineType.SGLANG), inst(4, Role.DECODE, engine=EngineType.SGLANG))
    s.decode_only_fallback = True
    broken(s)
    assert not s.has_schedulable_route()
    with pytest.raises(Unavailable, match="no schedulable prefill instance"):
        s.route(req())


@pytest.mark.parametrize("policy", ["round_robin", "least_load", "prefix_aware"])
def test_with_no_decode_schedulable_a_vllm_prefill_takes_requests_whole_with_the_fallback_only(
        policy: str, caplog: pytest.LogCaptureFixture) -> None:
    """Decodes broken: prefill-only routes to vLLM prefills (never SGLang's, which hand their KV
    to a decode), readiness holds, one WARNING per outage; a decode back: P/D again, one INFO."""
    def broken(s: Scheduler) -> None:
        for _ in range(2):
            s.record_failure(s.state.instances[2].endpoints[0])

    caplog.set_level(logging.INFO, logger="motor_coordinator.scheduler")
    s, now = sched(inst(1, Role.PREFILL), inst(2, Role.DECODE), inst(4, Role.PREFILL, engine=EngineType.SGLANG),
                   policy=policy)
    s.prefill_only_fallback = True
    assert s.served_alone() == {}
    broken(s)
    assert s.has_schedulable_route() and s.served_alone() == {"m": Role.PREFILL}
    routes = [s.route(req(i, f"p{i}")) for i in range(6)]
    assert {(r.prefill_only, r.decode_only, r.decode, r.union, r.engine) for r in routes} == {
        (True, False, None, None, EngineType.VLLM)}
    assert {r.prefill.instance.id for r in routes} == {1}  # type: ignore[union-attr]
    warned = [r for r in caplog.records if "no decode is schedulable for model 'm'" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelname == "WARNING"
    now[0] = 5.0
    s.record_probe(endpoint_key(s.state.instances[2].endpoints[0]), True)
    r = s.route(req(7))
    assert not r.prefill_only and r.decode.instance.id == 2  # type: ignore[union-attr]
    assert s.served_alone() == {}
    assert sum("a decode is schedulable again for model 'm'" in r.getMessage() for r in caplog.records) == 1

    s.prefill_only_fallback = False  # the fallback off: the old refusal
    broken(s)
    assert not s.has_schedulable_route()
    with pytest.raises(Unavailable, match="no schedulable decode instance"):
        s.route(req())
    s, _ = sched(inst(1, Role.PREFILL, engine=EngineType.SGLANG), inst(2, Role.DECODE, engine=EngineType.SGLANG))
    s.prefill_only_fallback = True
    broken(s)
    assert not s.has_schedulable_route()
    with pytest.raises(Unavailable, match="no schedulable decode instance"):
        s.route(req())


def test_accepting_a_new_snapshot_keeps_breakers_of_kept_endpoints() -> None:
    s, _ = sched(inst(1, Role.PREFILL), inst(3, Role.DECODE))
    p1 = s.state.instances[1].endpoints[0]
    s.record_failure(p1)
    s.record_failure(p1)
    s.accept(set_instances(s.state, [inst(1, Role.PREFILL), inst(3, Role.DECODE), inst(4, Role.UNION)], 0))
    assert s.is_broken(p1)


async def test_load_guard_counts_inflight_while_selecting_does_not() -> None:
    s, _ = sched(inst(1, Role.PREFILL), inst(3, Role.DECODE), policy="least_load")
    r = s.route(req())
    assert s.inflight(r.prefill.endpoint) == 0  # type: ignore[union-attr]
    async with s.load_guard(r.prefill, r.decode):
        assert s.inflight(r.prefill.endpoint) == 1  # type: ignore[union-attr]
        assert s.route(req()).prefill.inflight == 1  # type: ignore[union-attr]
    assert s.inflight(r.prefill.endpoint) == 0  # type: ignore[union-attr]


class _Estimating:
    """A policy with ``select_prefill``: the first prefill candidate, 100 tokens per prompt id."""

    name = "estimating"

    def select(self, role: Role, candidates: Sequence[Candidate], req: RequestInfo) -> Candidate:
        return candidates[0]

    def select_prefill(self, candidates: Sequence[Candidate], req: RequestInfo) -> PrefillChoice:
        return PrefillChoice(candidates[0], 100 * len(req.token_ids or ()))


async def test_the_prefill_estimate_is_queued_on_its_endpoint_while_the_prefill_runs() -> None:
    s = Scheduler(_Estimating())
    s.accept(set_instances(RegistryState(), [inst(1, Role.PREFILL), inst(3, Role.DECODE)], 0))
    r = s.route(RequestInfo(0, "m", "", (1, 2, 3)))
    assert r.prefill_tokens == 300
    p = r.prefill
    assert p is not None and p.queued_tokens == 0 and s.queued_tokens(p.endpoint) == 0
    async with s.load_guard(p, tokens=r.prefill_tokens):
        async with s.load_guard(p, tokens=50):
            assert s.queued_tokens(p.endpoint) == 350
            again = s.route(RequestInfo(1, "m", "", (1,)))
            assert again.prefill is not None and again.prefill.queued_tokens == 350
            assert again.prefill.inflight == 2
        assert s.queued_tokens(p.endpoint) == 300
    assert s.queued_tokens(p.endpoint) == 0 and s.inflight(p.endpoint) == 0
    with pytest.raises(RuntimeError):  # released on an error too
        async with s.load_guard(p, tokens=70):
            raise RuntimeError
    assert s.queued_tokens(p.endpoint) == 0
    plain, _ = sched(inst(1, Role.PREFILL), inst(3, Role.DECODE))  # no select_prefill: no estimate
    assert plain.route(RequestInfo(0, "m", "", (1, 2, 3))).prefill_tokens == 0


@pytest.mark.parametrize("policy", ["round_robin", "least_load", "prefix_aware"])
async def test_indexed_fast_path_chooses_exactly_what_select_over_all_candidates_chooses(policy: str) -> None:
    import random
    from contextlib import AsyncExitStack

    rnd = random.Random(7)
    instances = [inst(i + 1, role=Role.PREFILL if i % 2 == 0 else Role.DECODE) for i in range(40)]
    state = set_instances(RegistryState(), instances, 0)
    fast = Scheduler(make_policy(SchedulerConfig(policy=policy)), breaker_failures=1)
    slow = Scheduler(make_policy(SchedulerConfig(policy=policy)), breaker_failures=1)
    slow._select_index = None  # the reference: candidates built, Policy.select
    for s in (fast, slow):
        s.accept(state)
    async with AsyncExitStack() as guards:
        for seq in range(400):
            k = endpoint_key(rnd.choice(instances).endpoints[0])
            action = rnd.random()
            if action < 0.3:
                load = EngineLoad(running=rnd.choice([0, 1, 2]), kv_usage=rnd.choice([0.0, 0.25]))
                for s in (fast, slow):
                    s.set_load(k, load)
            elif action < 0.33:
                ok = rnd.random() < 0.5
                for s in (fast, slow):
                    s.record_probe(k, ok)
            info = RequestInfo(seq, "m", rnd.choice(["", "abc", "xyz"]))
            a, b = fast.route(info), slow.route(info)
            assert (a.prefill, a.decode) == (b.prefill, b.decode)
            if rnd.random() < 0.5:  # hold some requests in flight
                await guards.enter_async_context(fast.load_guard(a.prefill, a.decode))
                await guards.enter_async_context(slow.load_guard(b.prefill, b.decode))
