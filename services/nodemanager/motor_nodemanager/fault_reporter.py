"""The engine-publisher fault reporter (vLLM fault tolerance, ZMQ topic ``vllm_fault``).

With ``fault_tolerance_config.enable_fault_tolerance`` on and ``zmq_pub_port`` set, one ZMQ SUB
socket per endpoint connects to ``tcp://<node ip>:<zmq_pub_port + endpoint.id>`` and subscribes to
``vllm_fault``. Each message is ``[b"vllm_fault", json{"status": "healthy"|"unhealthy"|"dead", ...}]``
(see docs/simulator.md). Decisions (:func:`decide`, pure): healthy → nothing (and forget what was
reported); unhealthy → ENGINE_UNHEALTHY; dead → ENGINE_DEAD; a state is reported once, and it counts
as reported only after the controller accepted it (a refused report is tried again on the next
message). A ZMQ error closes the socket, waits ``zmq_retry_interval_sec`` (5 s) and re-subscribes.

The relaunch pauses the reporter (the publisher is down with its engine: its silence or a last
"dead" must not be reported again) and resumes it with a reset polling state afterwards. Every
socket is closed on pause and shutdown; the context is terminated on :meth:`close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

import orjson
import zmq
import zmq.asyncio

from motor_common.logs import request_id_var
from motor_nodemanager.controller_client import FaultLevel
from motor_nodemanager.detail import clip

log = logging.getLogger(__name__)

TOPIC = b"vllm_fault"
HEALTHY, UNHEALTHY, DEAD = "healthy", "unhealthy", "dead"

# endpoint id, level, detail -> accepted by the controller
SendFn = Callable[[int, FaultLevel, str], Awaitable[bool]]


def parse(frames: Sequence[bytes]) -> tuple[str, str] | None:
    """(status, reason) of a ``vllm_fault`` message, or None when it is not one."""
    if len(frames) != 2 or frames[0] != TOPIC:
        return None
    try:
        body = orjson.loads(frames[1])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict) or body.get("status") not in (HEALTHY, UNHEALTHY, DEAD):
        return None
    return str(body["status"]), str(body.get("reason") or "")


def decide(reported: str | None, status: str) -> FaultLevel | None:
    """The report a newly seen *status* calls for, given the state already reported (pure)."""
    if status == HEALTHY or status == reported:
        return None
    return FaultLevel.ENGINE_DEAD if status == DEAD else FaultLevel.ENGINE_UNHEALTHY


class FaultReporter:
    def __init__(
        self,
        ip: Callable[[], str],
        base_port: Callable[[], int | None],
        send: SendFn,
        retry_interval: Callable[[], float],
    ) -> None:
        self._ip = ip
        self._base_port = base_port
        self._send = send
        self._retry_interval = retry_interval
        self._ctx = zmq.asyncio.Context()
        self._endpoints: list[int] = []
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self.paused = False
        self.reported: dict[int, str] = {}
        self.messages = 0

    # --- control (called by the node) -----------------------------------------------------------
    def watch(self, endpoint_ids: Sequence[int]) -> None:
        """Engines (re)launched: follow these endpoints with a fresh state."""
        self._endpoints = list(endpoint_ids)
        self.reported.clear()
        self._restart()

    def pause(self) -> None:
        self.paused = True
        self._cancel()

    def resume(self, *, reset: bool) -> None:
        self.paused = False
        if reset:
            self.reported.clear()
        self._restart()

    def reconfigure(self) -> None:
        """Fault-tolerance switch or port hot-reloaded: rebuild the subscriptions."""
        self._restart()

    @property
    def subscribed(self) -> list[int]:
        return sorted(eid for eid, t in self._tasks.items() if not t.done())

    def _cancel(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()

    def _restart(self) -> None:
        self._cancel()
        port = self._base_port()
        if self.paused or port is None:
            return
        loop = asyncio.get_running_loop()
        for eid in self._endpoints:
            self._tasks[eid] = loop.create_task(self._run(eid, f"tcp://{self._ip()}:{port + eid}"),
                                                name=f"fault-reporter-{eid}")  # fmt: skip

    # --- one subscription -----------------------------------------------------------------------
    async def _run(self, eid: int, address: str) -> None:
        request_id_var.set("")
        while True:
            sock = self._ctx.socket(zmq.SUB)
            try:
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SUBSCRIBE, TOPIC)
                sock.connect(address)
                log.info("fault reporter subscribed", extra={"endpoint_id": eid, "address": address})
                while True:
                    frames = await sock.recv_multipart()
                    await self._on_message(eid, frames)
            except zmq.ZMQError as exc:
                log.warning("fault reporter ZMQ error, re-subscribing in %ss: %s", self._retry_interval(), exc,
                            extra={"endpoint_id": eid, "address": address})  # fmt: skip
            finally:
                sock.close(0)
            await asyncio.sleep(self._retry_interval())

    async def _on_message(self, eid: int, frames: Sequence[bytes]) -> None:
        msg = parse(frames)
        if msg is None:
            return
        self.messages += 1
        status, reason = msg
        if status == HEALTHY:
            self.reported.pop(eid, None)
            return
        level = decide(self.reported.get(eid), status)
        if level is None:
            return
        if await self._send(eid, level, clip(f"engine publisher: {status}: {reason}".rstrip(": "))):
            self.reported[eid] = status

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        self._cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._ctx.term()
