"""Operator pause/resume decisions (pure) and their persisted form."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from motor_common.domain import Endpoint, EngineType, Instance, Role
from motor_common.errors import FailedPrecondition, InvalidArgument
from motor_controller import codec
from motor_controller.model import InstanceState, ManagedInstance
from motor_controller.operator_pause import check_reason, pause, resume

INST = Instance(7, Role.DECODE, "job", "m", EngineType.VLLM, (Endpoint(0, "10.0.0.1", 9000, dp_rank=0, node_id="n"),))
MI = ManagedInstance(7, "job", 0, InstanceState.ACTIVE, INST, ("n",), "", 1.0, reason="healthy")


def test_pause_records_reason_and_time_and_a_second_pause_changes_nothing() -> None:
    paused = pause(MI, "bad GPU", 100.0)
    assert paused is not None
    assert (paused.paused, paused.pause_reason, paused.paused_at) == (True, "bad GPU", 100.0)
    assert (paused.state, paused.reason, paused.instance) == (MI.state, MI.reason, MI.instance)
    assert pause(paused, "another reason", 200.0) is None  # idempotent: the first reason stays


def test_pause_without_reason_says_who_paused_it() -> None:
    paused = pause(MI, "", 1.0)
    assert paused is not None and paused.pause_reason == "paused by an operator"


def test_resume_clears_the_pause_and_resuming_an_unpaused_instance_changes_nothing() -> None:
    paused = pause(MI, "x", 1.0)
    assert paused is not None
    resumed = resume(paused)
    assert resumed == MI
    assert resume(MI) is None


@pytest.mark.parametrize("verb", ["pause", "resume"])
def test_a_deleted_instance_is_a_failed_precondition(verb: str) -> None:
    gone = replace(MI, state=InstanceState.DELETED, reason="terminated", paused=True)
    with pytest.raises(FailedPrecondition) as err:
        pause(gone, "", 1.0) if verb == "pause" else resume(gone)
    assert err.value.reason == "INSTANCE_DELETED" and "deleted" in err.value.message


def test_a_pause_of_an_instance_not_active_yet_is_kept() -> None:
    starting = replace(MI, state=InstanceState.STARTING)
    paused = pause(starting, "hold", 1.0)
    assert paused is not None and paused.paused and paused.state is InstanceState.STARTING


@pytest.mark.parametrize("bad", ["x" * 257, "é" * 129, "two\nlines", "bell\x07"])
def test_reasons_are_one_bounded_line(bad: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        check_reason(bad)
    assert err.value.reason == "INVALID_REASON"
    assert check_reason("x" * 256) == "x" * 256


def test_the_pause_is_persisted_with_the_instance_and_old_records_read_as_not_paused() -> None:
    paused = pause(MI, "drain", 5.0)
    assert paused is not None
    assert codec.decode_instance(codec.encode_instance(paused)) == paused
    old = orjson.loads(codec.encode_instance(MI))
    for key in ("paused", "pause_reason", "paused_at"):
        del old[key]
    assert codec.decode_instance(orjson.dumps(old)) == MI


def test_a_call_names_an_instance_or_one_of_its_nodes_never_both() -> None:
    from motor_common.errors import NotFound
    from motor_controller.operator_pause import target

    gone = replace(MI, id=8, state=InstanceState.DELETED, node_ids=("old",))
    assert target(7, "", [MI]) == 7
    assert target(0, "n", [gone, MI]) == 7
    for iid, node in ((0, ""), (7, "n")):
        with pytest.raises(InvalidArgument) as bad:
            target(iid, node, [MI])
        assert bad.value.reason == "INVALID_TARGET"
    with pytest.raises(NotFound) as missing:
        target(0, "old", [gone, MI])  # its instance is deleted
    assert missing.value.reason == "NODE_NOT_FOUND"
