"""Bounds on a reported alarm (pure: proto in, domain alarm out). Every active alarm is persisted and
reloaded, so an alarm's size is bounded well below the generic request limits: its identity and
address are refused beyond them, its free-text message is cut."""

from __future__ import annotations

import pytest

from motor_common.errors import InvalidArgument
from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_controller.convert import (
    MAX_ALARM_ADDRESS,
    MAX_ALARM_INSTANCE_IDS,
    MAX_ALARM_MESSAGE,
    MAX_ALARM_SOURCE,
    alarm_from_pb,
)


def precision(**kw: object) -> pb.Alarm:
    fields: dict[str, object] = {"kind": pb.ALARM_KIND_PRECISION, "action": pb.ALARM_ACTION_RAISE,
                                 "source": "coordinator@10.0.0.1:9100", "instance_ids": [11, 22],
                                 "address": "10.0.0.1:9100", "message": "wrong answer", **kw}
    return pb.Alarm(**fields)  # type: ignore[arg-type]


def test_an_alarm_within_the_bounds_is_taken_as_sent() -> None:
    source = "coordinator@" + "h" * (MAX_ALARM_SOURCE - len("coordinator@"))
    alarm = alarm_from_pb(precision(source=source, address="a" * MAX_ALARM_ADDRESS, message="m" * MAX_ALARM_MESSAGE),
                          wall=5.0)
    assert (alarm.source, alarm.instance_ids, alarm.message) == (source, (11, 22), "m" * MAX_ALARM_MESSAGE)


@pytest.mark.parametrize(("field", "msg"), [
    ("alarm.source", precision(source="c@" + "h" * MAX_ALARM_SOURCE)),
    ("alarm.address", precision(address="a" * (MAX_ALARM_ADDRESS + 1))),
    ("alarm.instance_ids", precision(instance_ids=list(range(1, MAX_ALARM_INSTANCE_IDS + 2)))),
    # a controller raises STATE_LOAD_FAILED about itself; a node key must not forge or clear it
    ("alarm.kind", precision(kind=pb.ALARM_KIND_STATE_LOAD_FAILED, instance_ids=[])),
])
def test_an_oversized_identity_or_address_is_refused_naming_the_field(field: str, msg: pb.Alarm) -> None:
    with pytest.raises(InvalidArgument) as err:
        alarm_from_pb(msg, wall=5.0)
    assert err.value.reason == "INVALID_ALARM" and err.value.metadata == {"field": field}


def test_an_oversized_message_is_cut_and_the_alarm_taken() -> None:
    alarm = alarm_from_pb(precision(message="x" * 4096), wall=5.0)
    assert len(alarm.message) == MAX_ALARM_MESSAGE and alarm.message.endswith("…")
    assert alarm.instance_ids == (11, 22)
