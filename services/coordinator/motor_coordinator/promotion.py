"""Announce a promotion to the controller: ``ReportAlarm(ALARM_KIND_COORDINATOR_PROMOTED)``.

On becoming master the coordinator tells the controller its own gRPC address so that the
controller pushes a full SET to it at once (SPEC §3.4). The report is retried every
``retry_interval`` seconds (each call with its own timeout) until the controller accepts it; a
newer promotion or a demotion cancels the pending one.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

import grpc

from motor_common.credentials import Credential
from motor_common.gen.motor.controller.v1 import controller_pb2 as ctl
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as ctl_grpc
from motor_common.grpc_client import call_metadata, open_channel
from motor_common.logs import new_request_id
from motor_common.tasks import TaskOwner
from motor_common.tls import TlsConfig

log = logging.getLogger(__name__)


class AlarmSink(Protocol):
    async def report(self, alarm: ctl.Alarm) -> bool: ...

    async def close(self) -> None: ...


class ControllerAlarms:
    """``ControllerService.ReportAlarm`` over one channel (management key as metadata)."""

    def __init__(self, address: str, *, management_key: Credential, timeout: float,
                 tls: TlsConfig | None = None) -> None:
        self.address = address
        self._channel = open_channel(address, tls=tls)
        self._stub = ctl_grpc.ControllerServiceStub(self._channel)
        self._key = management_key
        self._timeout = timeout

    async def report(self, alarm: ctl.Alarm) -> bool:
        rid = new_request_id()
        resp = await self._stub.ReportAlarm(
            ctl.ReportAlarmRequest(alarm=alarm, request_id=rid),
            timeout=self._timeout, metadata=call_metadata(self._key, rid),
        )
        return bool(resp.accepted)

    async def active(self, kind: int, limit: int = 10_000) -> list[ctl.Alarm]:
        """The controller's active alarms of *kind* (``ListAlarms``, every page, at most *limit*)."""
        stub = ctl_grpc.ControllerAdminServiceStub(self._channel)
        out: list[ctl.Alarm] = []
        token = ""
        while len(out) < limit:
            page = await stub.ListAlarms(ctl.ListAlarmsRequest(active_only=True, page_token=token),
                                         timeout=self._timeout, metadata=call_metadata(self._key))  # fmt: skip
            out.extend(a for a in page.alarms if a.kind == kind)
            token = page.next_page_token
            if not token:
                break
        return out[:limit]

    async def close(self) -> None:
        await self._channel.close()


def promotion_alarm(address: str, term: int) -> ctl.Alarm:
    alarm = ctl.Alarm(
        kind=ctl.ALARM_KIND_COORDINATOR_PROMOTED,
        action=ctl.ALARM_ACTION_RAISE,
        source=f"coordinator@{address}",
        address=address,
        message=f"coordinator {address} became master (term {term})",
    )
    alarm.raised_at.GetCurrentTime()
    return alarm


class PromotionAnnouncer:
    def __init__(self, sink: AlarmSink, address: str, *, retry_interval: float = 1.0) -> None:
        self.sink = sink
        self.address = address
        self.retry_interval = retry_interval
        self.accepted_terms: list[int] = []
        self._tasks = TaskOwner("promotion")
        self._pending: asyncio.Task[None] | None = None

    def promoted(self, term: int) -> None:
        self.cancel()
        self._pending = self._tasks.spawn(self._announce(term), name=f"announce-term-{term}")

    def cancel(self) -> None:
        if self._pending is not None and not self._pending.done():
            self._pending.cancel()
        self._pending = None

    async def _announce(self, term: int) -> None:
        attempt = 0
        while True:
            attempt += 1
            try:
                if await self.sink.report(promotion_alarm(self.address, term)):
                    self.accepted_terms.append(term)
                    log.info("promotion announced to the controller",
                             extra={"term": term, "attempts": attempt})
                    return
                log.warning("controller did not accept the promotion alarm; retrying")
            except grpc.aio.AioRpcError as exc:
                if attempt == 1 or attempt % 30 == 0:
                    log.warning("promotion alarm failed (%s: %s); retrying every %.3gs",
                                exc.code().name, exc.details(), self.retry_interval)
            await asyncio.sleep(self.retry_interval)

    async def close(self) -> None:
        await self._tasks.close()
        await self.sink.close()
