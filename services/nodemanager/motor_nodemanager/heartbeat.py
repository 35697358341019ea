"""The heartbeat stream: one frame per ``heartbeat_interval_seconds``, acks read concurrently.

A failed stream is re-opened with capped exponential back-off; the nodemanager never exits because
the controller is down. ``REREGISTER`` in an ack triggers ``on_reregister``. Heartbeats only carry
observed state; they decide nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from motor_common.errors import MotorError
from motor_common.heartbeats import reconnect_delay
from motor_nodemanager.controller_client import AckCommand, ControllerPeer, HeartbeatFrame

log = logging.getLogger(__name__)

__all__ = ["HeartbeatSender", "reconnect_delay"]


class HeartbeatSender:
    def __init__(
        self,
        peer: ControllerPeer,
        frame: Callable[[], HeartbeatFrame | None],
        interval: Callable[[], float],
        on_reregister: Callable[[], Coroutine[Any, Any, None]],
        *,
        addresses: int = 1,
    ) -> None:
        self._peer = peer
        self._addresses = addresses
        self._frame = frame
        self._interval = interval
        self._on_reregister = on_reregister
        self._wake = asyncio.Event()
        self.frames_sent = 0
        self.acks = 0
        self.connected = False

    def poke(self) -> None:
        """Send the next frame now (state changed, interval changed)."""
        self._wake.set()

    async def _frames(self) -> AsyncIterator[HeartbeatFrame]:
        while True:
            f = self._frame()
            if f is not None:
                self.frames_sent += 1
                yield f
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval()):
                    await self._wake.wait()

    async def run(self) -> None:
        failures = 0
        reregistering: asyncio.Task[None] | None = None
        try:
            while True:
                try:
                    async for ack in self._peer.heartbeat(self._frames()):
                        if not self.connected:
                            log.info("heartbeat stream established")
                        self.connected = True
                        failures = 0
                        self.acks += 1
                        if ack.command is AckCommand.REREGISTER and (
                            reregistering is None or reregistering.done()
                        ):
                            log.warning("controller asked to re-register: %s", ack.message or "(no reason)")
                            reregistering = asyncio.create_task(self._on_reregister())
                    raise MotorError("heartbeat stream closed by the controller")
                except MotorError as exc:
                    failures += 1
                    delay = reconnect_delay(failures, addresses=self._addresses)
                    if self.connected or failures == 1:
                        log.warning("heartbeat stream failed, reconnecting in %.2fs: %s", delay, exc.message)
                    self.connected = False
                    await asyncio.sleep(delay)
        finally:
            self.connected = False
            if reregistering is not None and not reregistering.done():
                reregistering.cancel()
