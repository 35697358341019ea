"""ListAlarms in pages (servicer over a real Controller, in-memory store)."""

from __future__ import annotations

import pytest

from motor_common.errors import InvalidArgument
from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_controller.alarms import Alarm, AlarmAction, AlarmKind
from motor_controller.config import ControllerConfig
from motor_controller.controller import Controller
from motor_controller.service import MAX_ALARM_PAGE, ControllerAdminServicer
from motor_controller.store import MemoryStore
from tests.controller.test_push_targets import NoNodeManagers


async def test_alarms_come_in_pages_that_together_are_the_whole_list() -> None:
    ctl = Controller(ControllerConfig(), MemoryStore(), NoNodeManagers())  # type: ignore[arg-type]
    for i in range(MAX_ALARM_PAGE + 5):
        await ctl.report_alarm(Alarm(AlarmKind.STORE_UNAVAILABLE, AlarmAction.RAISE, f"src-{i:04d}", (),
                                     message="m" * 4096, raised_at=float(i)))
    admin = ControllerAdminServicer(ctl)
    sources: list[str] = []
    token = ""
    sizes = []
    while True:
        resp = await admin.ListAlarms(pb.ListAlarmsRequest(active_only=True, page_token=token), None)
        sizes.append(len(resp.alarms))
        assert resp.ByteSize() < 4 * 1024 * 1024  # a default client takes every page
        sources += [a.source for a in resp.alarms]
        token = resp.next_page_token
        if not token:
            break
    assert sizes == [MAX_ALARM_PAGE, 5]
    assert sources == [f"src-{i:04d}" for i in range(MAX_ALARM_PAGE + 5)]  # all, once, in order
    small = await admin.ListAlarms(pb.ListAlarmsRequest(active_only=True, page_size=3), None)
    assert [a.source for a in small.alarms] == ["src-0000", "src-0001", "src-0002"] and small.next_page_token
    for bad in ("-1", "x", "\uff11"):  # a fullwidth digit: isdigit() but not ASCII
        with pytest.raises(InvalidArgument) as err:
            await admin.ListAlarms(pb.ListAlarmsRequest(page_token=bad), None)
        assert err.value.reason == "INVALID_PAGE_TOKEN"
    await ctl.close()
