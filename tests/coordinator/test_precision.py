"""Precision alarms, pure parts: sample comparison, the per-group state machine, alarm identity,
group enumeration, learned answers, and scheduling around alarmed groups."""

from __future__ import annotations

import pytest

from motor_common.config import ConfigError, build
from motor_common.domain import Endpoint, EngineType, Instance, InstanceStatus, Role
from motor_common.gen.motor.controller.v1 import controller_pb2 as ctl
from motor_coordinator.config import CoordinatorConfig, SchedulerConfig
from motor_coordinator.policies import RequestInfo
from motor_coordinator.policies.round_robin import RoundRobin
from motor_coordinator.precision import (
    Action,
    GroupState,
    PrecisionTracker,
    Sample,
    classify,
    combine,
    extract_text,
    learn_expected,
    probe_groups,
    step,
)
from motor_coordinator.precision_config import PrecisionConfig, PrecisionPrompt
from motor_coordinator.precision_monitor import alarm_to_pb
from motor_coordinator.precision_routing import PrecisionAwareScheduler
from motor_coordinator.registry import RegistryState


def inst(iid: int, role: Role, port: int, *, model: str = "m", engine: EngineType = EngineType.VLLM,
         status: InstanceStatus = InstanceStatus.AVAILABLE) -> Instance:
    return Instance(iid, role, f"job-{iid}", model, engine, (Endpoint(0, "127.0.0.1", port),), status)


# -- comparison -----------------------------------------------------------------------------------
def test_sample_equal_text_is_normal_whitespace_insensitive() -> None:
    assert classify(" Paris is\nthe capital ", "Paris is the capital") is Sample.NORMAL


def test_sample_different_text_is_abnormal() -> None:
    assert classify("Lyon", "Paris") is Sample.ABNORMAL


def test_no_answer_or_no_expected_text_is_not_a_sample() -> None:
    assert classify(None, "Paris") is Sample.ERROR
    assert classify("Paris", None) is Sample.ERROR


def test_any_abnormal_prompt_makes_the_round_abnormal_and_a_missing_answer_makes_it_no_sample() -> None:
    assert combine([Sample.NORMAL, Sample.ABNORMAL]) is Sample.ABNORMAL
    assert combine([Sample.NORMAL, Sample.NORMAL]) is Sample.NORMAL
    assert combine([Sample.NORMAL, Sample.ERROR]) is Sample.ERROR
    assert combine([]) is Sample.ERROR


def test_learned_answer_is_the_strict_majority_else_none() -> None:
    assert learn_expected(["a b", "a  b", "c", None]) == "a b"
    assert learn_expected(["a", "c"]) is None
    assert learn_expected([None]) is None
    assert learn_expected(["only"]) == "only"


def test_extract_text_of_completions_and_chat_answers() -> None:
    assert extract_text(False, {"choices": [{"text": "x"}]}) == "x"
    assert extract_text(True, {"choices": [{"message": {"content": "y"}}]}) == "y"
    assert extract_text(False, {"error": {}}) is None
    assert extract_text(True, {"choices": [{"message": None}]}) is None


# -- state machine --------------------------------------------------------------------------------
def test_abnormal_raises_once_and_threshold_consecutive_normals_clear() -> None:
    t = PrecisionTracker("coordinator@c:1", clear_threshold=3)
    g = (1, 2)
    assert t.observe(g, Sample.NORMAL) is None
    raised = t.observe(g, Sample.ABNORMAL, "prompt 0")
    assert raised is not None and raised.action is Action.RAISE
    assert t.observe(g, Sample.ABNORMAL) is None  # already raised
    assert t.alarmed() == {g}
    assert t.observe(g, Sample.NORMAL) is None
    assert t.observe(g, Sample.NORMAL) is None
    cleared = t.observe(g, Sample.NORMAL)
    assert cleared is not None and cleared.action is Action.CLEAR
    assert t.alarmed() == frozenset()


def test_abnormal_sample_resets_the_normal_streak() -> None:
    t = PrecisionTracker("s", clear_threshold=2)
    t.observe((1, 2), Sample.ABNORMAL)
    assert t.observe((1, 2), Sample.NORMAL) is None
    assert t.observe((1, 2), Sample.ABNORMAL) is None
    assert t.observe((1, 2), Sample.NORMAL) is None  # streak restarted
    ev = t.observe((1, 2), Sample.NORMAL)
    assert ev is not None and ev.action is Action.CLEAR


def test_errors_neither_count_nor_break_the_streak() -> None:
    s, a = step(GroupState(alarmed=True, normal_streak=1), Sample.ERROR, 2)
    assert a is None and s.alarmed and s.normal_streak == 1
    s, a = step(s, Sample.NORMAL, 2)
    assert a is Action.CLEAR and not s.alarmed


def test_groups_are_independent() -> None:
    t = PrecisionTracker("s", clear_threshold=1)
    t.observe((1, 2), Sample.ABNORMAL)
    t.observe((1, 3), Sample.NORMAL)
    assert t.alarmed() == {(1, 2)}


def test_an_adopted_alarm_is_cleared_under_its_own_identity_and_a_new_one_under_ours() -> None:
    """A restarted (or newly elected) coordinator adopts the alarms the controller holds: the
    group is alarmed at once, threshold normal samples clear it with the source that raised it; a
    later raise of the same group is this coordinator's own."""
    t = PrecisionTracker("coordinator@new:2", clear_threshold=2)
    assert t.adopt((1, 2), "coordinator@old:1") is True
    assert t.alarmed() == {(1, 2)}
    assert t.observe((1, 2), Sample.ABNORMAL) is None  # still alarmed: no second raise
    assert t.observe((1, 2), Sample.NORMAL) is None
    cleared = t.observe((1, 2), Sample.NORMAL)
    assert cleared is not None and cleared.action is Action.CLEAR
    assert cleared.identity.source == "coordinator@old:1"
    raised = t.observe((1, 2), Sample.ABNORMAL)
    assert raised is not None and raised.identity.source == "coordinator@new:2"
    assert t.adopt((1, 2), "coordinator@old:1") is False  # alarmed here already: its own stays
    assert t.identity((1, 2)).source == "coordinator@new:2"
    t.adopt((3, 4), "coordinator@old:1")
    t.retain([1, 2])  # the group left the registry: forgotten with its adopted source
    assert t.identity((3, 4)).source == "coordinator@new:2"


def test_clear_and_raise_carry_the_same_alarm_identity() -> None:
    t = PrecisionTracker("coordinator@127.0.0.1:5", clear_threshold=1)
    raised = t.observe((7, 9), Sample.ABNORMAL)
    cleared = t.observe((7, 9), Sample.NORMAL)
    assert raised is not None and cleared is not None
    assert raised.identity == cleared.identity
    pr, pc = alarm_to_pb(raised, "127.0.0.1:5"), alarm_to_pb(cleared, "127.0.0.1:5")
    assert (pr.kind, pr.source, list(pr.instance_ids)) == (pc.kind, pc.source, list(pc.instance_ids))
    assert pr.kind == ctl.ALARM_KIND_PRECISION and list(pr.instance_ids) == [7, 9]
    assert (pr.action, pc.action) == (ctl.ALARM_ACTION_RAISE, ctl.ALARM_ACTION_CLEAR)


def test_external_clear_drops_alarm_state_without_an_event_and_matches_by_instance() -> None:
    t = PrecisionTracker("s", clear_threshold=5)
    t.observe((1, 2), Sample.ABNORMAL)
    t.observe((3, 4), Sample.ABNORMAL)
    assert t.drop([2]) == [(1, 2)]
    assert t.alarmed() == {(3, 4)}
    assert t.drop([]) == [(3, 4)]
    assert t.alarmed() == frozenset()
    assert t.observe((1, 2), Sample.ABNORMAL) is not None  # raised anew if still wrong


def test_groups_of_instances_that_left_the_registry_are_forgotten() -> None:
    t = PrecisionTracker("s", clear_threshold=5)
    t.observe((1, 2), Sample.ABNORMAL)
    t.observe((1, 3), Sample.ABNORMAL)
    assert t.retain([1, 3]) == [(1, 2)]
    assert t.groups() == [(1, 3)]


# -- groups ---------------------------------------------------------------------------------------
def test_probe_groups_are_every_available_pair_of_one_model_and_engine_and_each_union() -> None:
    insts = [
        inst(1, Role.PREFILL, 1001), inst(2, Role.PREFILL, 1002), inst(3, Role.DECODE, 1003),
        inst(4, Role.DECODE, 1004, engine=EngineType.SGLANG),  # other engine: no pair
        inst(5, Role.PREFILL, 1005, status=InstanceStatus.PAUSED),
        inst(6, Role.UNION, 1006), inst(7, Role.DECODE, 1007, model="other"),
    ]
    assert [g.ids for g in probe_groups(insts)] == [(1, 3), (2, 3), (6,)]


# -- config ---------------------------------------------------------------------------------------
def test_precision_config_is_strict_and_needs_one_of_prompt_or_messages() -> None:
    cfg = build(CoordinatorConfig, {"precision_clear_threshold": 3, "precision": {
        "enabled": True, "interval_sec": 0.5,
        "prompts": [{"prompt": "p", "expected": "e"}, {"messages": [{"role": "user", "content": "hi"}]}]}})
    assert cfg.precision.prompts[1].messages == ({"role": "user", "content": "hi"},)
    with pytest.raises(ConfigError, match="exactly one"):
        build(PrecisionConfig, {"prompts": [{"prompt": "p", "messages": [{"role": "user", "content": "x"}]}]})
    with pytest.raises(ConfigError, match=r"unknown configuration key 'precision\.intervl_sec'"):
        build(CoordinatorConfig, {"precision": {"intervl_sec": 1}})
    with pytest.raises(ConfigError, match="precision_clear_threshold"):
        build(CoordinatorConfig, {"precision_clear_threshold": 0})
    assert PrecisionPrompt(prompt="x").expected is None


# -- scheduling around alarmed groups -------------------------------------------------------------
def sched(*insts: Instance) -> PrecisionAwareScheduler:
    s = PrecisionAwareScheduler(RoundRobin(SchedulerConfig()))
    s.accept(RegistryState(instances={i.id: i for i in insts}))
    return s


def pair(s: PrecisionAwareScheduler, seq: int) -> tuple[int, ...]:
    r = s.route(RequestInfo(seq, "m"))
    if r.union is not None:
        return (r.union.instance.id,)
    assert r.prefill is not None and r.decode is not None
    return (r.prefill.instance.id, r.decode.instance.id)


def test_alarmed_pair_is_avoided_when_another_healthy_pair_exists() -> None:
    s = sched(inst(1, Role.PREFILL, 1001), inst(2, Role.PREFILL, 1002), inst(3, Role.DECODE, 1003))
    s.set_alarmed(frozenset({(1, 3)}))
    assert {pair(s, i) for i in range(6)} == {(2, 3)}


def test_alarmed_pair_is_still_used_when_it_is_the_only_one() -> None:
    s = sched(inst(1, Role.PREFILL, 1001), inst(3, Role.DECODE, 1003))
    s.set_alarmed(frozenset({(1, 3)}))
    assert pair(s, 0) == (1, 3)


def test_alarmed_union_is_avoided_and_pairs_fall_back_to_a_healthy_union() -> None:
    s = sched(inst(1, Role.PREFILL, 1001), inst(3, Role.DECODE, 1003), inst(5, Role.UNION, 1005),
              inst(6, Role.UNION, 1006))
    s.set_alarmed(frozenset({(1, 3), (5,)}))
    assert {pair(s, i) for i in range(4)} == {(6,)}
