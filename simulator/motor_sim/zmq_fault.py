"""vLLM fault-tolerance surface: a ZMQ PUB socket on ``zmq_pub_port + dp_rank``.

Every ``interval`` seconds and on every change it publishes a multipart message
``[b"vllm_fault", orjson({"status": "healthy"|"unhealthy"|"dead", "dp_rank": int,
"engine_id": str, "reason": str, "timestamp": float})]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
import zmq
import zmq.asyncio

log = logging.getLogger("motor_sim.zmq")
TOPIC = b"vllm_fault"


class FaultPublisher:
    def __init__(self, host: str, port: int, status: Callable[[], dict[str, Any]],
                 interval_s: float) -> None:
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        bind_host = "*" if host in ("0.0.0.0", "") else host
        self._sock.bind(f"tcp://{bind_host}:{port}")
        self.port = port
        self._status = status
        self._interval = interval_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="zmq-fault-publisher")

    def poke(self) -> None:
        self._wake.set()

    async def publish_now(self) -> None:
        msg = dict(self._status(), timestamp=time.time())
        # a lost status is sent again next interval: neither a ZMQ error nor a stalled send
        # (a PUB socket drops at its high-water mark, so that is rare) may end the loop
        with contextlib.suppress(zmq.ZMQError, TimeoutError):
            async with asyncio.timeout(1.0):
                await self._sock.send_multipart([TOPIC, orjson.dumps(msg)])

    async def _loop(self) -> None:
        while True:
            await self.publish_now()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await self._wake.wait()
            self._wake.clear()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._sock.close(0)
        self._ctx.term()
