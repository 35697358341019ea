"""Alarm delivery from a real ``motor-controller``: a precision alarm reported over gRPC (as a
coordinator reports it) reaches a local webhook receiver, after a failed first attempt (retry),
and its CLEAR follows; in Motor's JSON and in Alertmanager's API v2 format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from motor_common.gen.motor.controller.v1 import controller_pb2 as pb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as pbgrpc
from motor_common.grpc_client import call_metadata, open_channel
from motor_controller.alarm_webhook import AlarmWebhookConfig
from tests.controller.fakes import KEY
from tests.helpers import wait_for
from tests.procs import start_controller

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


class Receiver:
    def __init__(self) -> None:
        self.bodies: list[Any] = []
        self.attempts = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.attempts += 1
        if self.attempts == 1:
            return web.Response(status=503)  # the first delivery fails: the controller must retry
        self.bodies.append(await request.json())
        return web.Response(status=200)


def _alarm(action: int) -> pb.ReportAlarmRequest:
    return pb.ReportAlarmRequest(alarm=pb.Alarm(
        kind=pb.ALARM_KIND_PRECISION, action=action, source="coordinator@test", instance_ids=[7, 8],
        message="P/D group 7-8 answers wrongly"))


@pytest.mark.parametrize("fmt", ["motor", "alertmanager"])
async def test_precision_alarm_and_its_clear_reach_the_webhook(tmp_path: Path, fmt: str) -> None:
    receiver = Receiver()
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    cfg = {"alarms": {"webhook_url": f"http://127.0.0.1:{port}/hook", "format": fmt,
                      "retry_base_sec": 0.1, "retry_max_sec": 0.5}}
    try:
        async with start_controller(tmp_path, cfg, management_key=KEY) as proc, \
                open_channel(proc.address) as ch:
            stub = pbgrpc.ControllerServiceStub(ch)
            md = call_metadata(KEY)
            resp = await stub.ReportAlarm(_alarm(pb.ALARM_ACTION_RAISE), metadata=md, timeout=5)
            assert resp.accepted
            await wait_for(lambda: len(receiver.bodies) >= 1, timeout=15, what="ALARM delivered")
            assert receiver.attempts >= 2
            await stub.ReportAlarm(_alarm(pb.ALARM_ACTION_CLEAR), metadata=md, timeout=5)
            await wait_for(lambda: len(receiver.bodies) >= 2, timeout=15, what="CLEAR delivered")
    finally:
        await runner.cleanup()
    raised, cleared = receiver.bodies[:2]
    if fmt == "motor":
        assert raised["action"] == "ALARM" and cleared["action"] == "CLEAR"
        for body in (raised, cleared):
            assert body["kind"] == "precision" and body["instance_ids"] == [7, 8]
            assert body["source"] == "coordinator@test"
        assert raised["message"] == "P/D group 7-8 answers wrongly"
    else:
        (a,), (c,) = raised, cleared
        assert a["labels"] == c["labels"] == {"alertname": "MotorPrecision", "kind": "precision",
                                             "source": "coordinator@test", "instance_ids": "7,8",
                                             "service": "motor"}
        assert "endsAt" not in a and c["endsAt"] >= a["startsAt"]
        assert a["annotations"]["summary"] == "P/D group 7-8 answers wrongly"


def test_bad_webhook_config_is_refused() -> None:
    for bad, needle in [({"webhook_url": "ftp://x"}, "webhook_url"), ({"format": "slack"}, "format"),
                        ({"max_outbox": 0}, "max_outbox"), ({"retry_base_sec": 0}, "retry_base_sec")]:
        with pytest.raises(ValueError, match=needle):
            AlarmWebhookConfig(**bad)  # type: ignore[arg-type]


async def test_outbox_is_bounded_oldest_dropped() -> None:
    from motor_controller.alarm_webhook import DROPPED, AlarmWebhook
    from motor_controller.alarms import Alarm, AlarmAction, AlarmKind

    hook = AlarmWebhook(AlarmWebhookConfig(webhook_url="http://127.0.0.1:9/x", max_outbox=3))
    before = DROPPED._value.get()
    alarms = [Alarm(AlarmKind.PRECISION, AlarmAction.RAISE, "s", (i,)) for i in range(5)]
    for a in alarms:
        hook.notify(a)  # not started: nothing is delivered
    assert list(hook._outbox) == alarms[2:]
    assert DROPPED._value.get() - before == 2
