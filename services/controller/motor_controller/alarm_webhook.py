"""Alarm delivery: every RAISE and CLEAR the controller applies is POSTed to a webhook.

Formats: ``motor`` (one JSON object per alarm: ``action`` ALARM/CLEAR, ``kind``, ``source``,
``instance_ids``, ``address``, ``message``, ``raised_at``, ``sent_at``) and ``alertmanager``
(Alertmanager's API v2 ``POST /api/v2/alerts``: a list with one alert whose ``labels`` identify
the alarm and whose ``endsAt`` is set on CLEAR, which resolves it). Delivery is in order, one at a
time, retried with exponential backoff (``retry_base_sec`` .. ``retry_max_sec``) until the
receiver answers 2xx; the outbox holds at most ``max_outbox`` alarms, and when full the oldest
waiting one is dropped (counted and logged), so a dead receiver never grows memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import orjson
from prometheus_client import Counter, Gauge

from motor_common.tasks import TaskOwner
from motor_controller.alarms import Alarm, AlarmAction

log = logging.getLogger(__name__)

SENT = Counter("motor_controller_alarm_notifications_sent", "Alarm notifications the webhook accepted (2xx)",
               ["action"])
FAILED = Counter("motor_controller_alarm_notification_attempts_failed",
                 "Webhook deliveries that failed and will be retried (error or non-2xx answer)")
DROPPED = Counter("motor_controller_alarm_notifications_dropped",
                  "Alarm notifications dropped because the outbox was full (oldest first)")
OUTBOX = Gauge("motor_controller_alarm_outbox_length", "Alarm notifications waiting for delivery")


@dataclass(frozen=True)
class AlarmWebhookConfig:
    """``alarms`` section of the controller config; ``webhook_url`` "" = no delivery."""

    webhook_url: str = ""
    format: Literal["motor", "alertmanager"] = "motor"
    timeout_sec: float = 5.0
    retry_base_sec: float = 0.5
    retry_max_sec: float = 30.0
    max_outbox: int = 1000

    def __post_init__(self) -> None:
        if self.webhook_url and not self.webhook_url.startswith(("http://", "https://")):
            raise ValueError(f"alarms.webhook_url must be an http:// or https:// URL, got {self.webhook_url!r}")
        if self.format not in ("motor", "alertmanager"):
            raise ValueError(f"alarms.format must be 'motor' or 'alertmanager', got {self.format!r}")
        for name in ("timeout_sec", "retry_base_sec", "retry_max_sec"):
            if getattr(self, name) <= 0:
                raise ValueError(f"alarms.{name} must be > 0")
        if self.retry_max_sec < self.retry_base_sec:
            raise ValueError("alarms.retry_max_sec must be >= alarms.retry_base_sec")
        if not 1 <= self.max_outbox <= 1_000_000:
            raise ValueError("alarms.max_outbox must be in [1, 1000000]")


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}Z"


def motor_payload(alarm: Alarm, now: float) -> dict[str, Any]:
    return {"action": "ALARM" if alarm.action is AlarmAction.RAISE else "CLEAR", "kind": alarm.kind.value,
            "source": alarm.source, "instance_ids": list(alarm.instance_ids), "address": alarm.address,
            "message": alarm.message, "raised_at": _iso(alarm.raised_at) if alarm.raised_at else None,
            "sent_at": _iso(now)}


def alertmanager_payload(alarm: Alarm, now: float) -> list[dict[str, Any]]:
    """Alertmanager API v2 ``postableAlerts``: the same labels on ALARM and CLEAR (its identity);
    CLEAR sets ``endsAt`` to now, which resolves the alert."""
    alert: dict[str, Any] = {
        "labels": {"alertname": f"Motor{''.join(p.title() for p in alarm.kind.value.split('_'))}",
                   "kind": alarm.kind.value, "source": alarm.source,
                   "instance_ids": ",".join(str(i) for i in sorted(alarm.instance_ids)), "service": "motor"},
        "annotations": {"summary": alarm.message or alarm.kind.value, "address": alarm.address},
        "startsAt": _iso(alarm.raised_at or now),
    }
    if alarm.action is AlarmAction.CLEAR:
        alert["endsAt"] = _iso(now)
    return [alert]


class AlarmWebhook:
    """Delivers alarms in order from a bounded outbox; :meth:`notify` never blocks."""

    def __init__(self, cfg: AlarmWebhookConfig) -> None:
        self.cfg = cfg
        self._outbox: deque[Alarm] = deque()
        self._wake = asyncio.Event()
        self._tasks = TaskOwner("alarm-webhook")

    def start(self) -> None:
        self._tasks.spawn(self._deliver_loop(), name="alarm-webhook")

    async def close(self) -> None:
        await self._tasks.close()

    def notify(self, alarm: Alarm) -> None:
        if len(self._outbox) >= self.cfg.max_outbox:
            lost = self._outbox.popleft()
            DROPPED.inc()
            log.warning("alarm outbox full: oldest notification dropped",
                        extra={"kind": lost.kind.value, "action": lost.action.value, "max_outbox": self.cfg.max_outbox})
        self._outbox.append(alarm)
        OUTBOX.set(len(self._outbox))
        self._wake.set()

    def _body(self, alarm: Alarm) -> bytes:
        now = time.time()
        if self.cfg.format == "alertmanager":
            return orjson.dumps(alertmanager_payload(alarm, now))
        return orjson.dumps(motor_payload(alarm, now))

    async def _deliver_loop(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.cfg.timeout_sec)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                if not self._outbox:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                alarm = self._outbox[0]
                delay = self.cfg.retry_base_sec
                while not await self._send(http, alarm):
                    FAILED.inc()
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.cfg.retry_max_sec)
                    if not self._outbox or self._outbox[0] is not alarm:
                        break  # dropped while waiting (outbox overflow)
                else:
                    SENT.labels("ALARM" if alarm.action is AlarmAction.RAISE else "CLEAR").inc()
                    if self._outbox and self._outbox[0] is alarm:
                        self._outbox.popleft()
                OUTBOX.set(len(self._outbox))

    async def _send(self, http: aiohttp.ClientSession, alarm: Alarm) -> bool:
        try:
            async with http.post(self.cfg.webhook_url, data=self._body(alarm),
                                 headers={"Content-Type": "application/json"}) as resp:
                if 200 <= resp.status < 300:
                    return True
                log.warning("alarm webhook answered %d; retrying", resp.status, extra={"kind": alarm.kind.value})
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("alarm webhook unreachable; retrying", extra={"error": str(exc) or type(exc).__name__})
        return False
