"""The simulator's vLLM fault publisher keeps publishing after a send that stalls past its bound."""

from __future__ import annotations

import asyncio
from typing import Any

from motor_sim.zmq_fault import FaultPublisher
from tests.helpers import free_port, wait_for


async def test_a_stalled_send_does_not_end_the_publish_loop() -> None:
    pub = FaultPublisher("127.0.0.1", free_port(), lambda: {"status": "healthy"}, 0.01)
    sends: list[Any] = []

    async def send_multipart(parts: Any) -> None:
        sends.append(parts)
        if len(sends) == 1:
            await asyncio.Event().wait()  # the first send never completes: cut at 1 s

    pub._sock.send_multipart = send_multipart  # type: ignore[method-assign]
    pub.start()
    try:
        await wait_for(lambda: len(sends) >= 3, timeout=15, what="publishing after the stalled send")
        assert pub._task is not None and not pub._task.done()
    finally:
        await pub.close()
