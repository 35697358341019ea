"""Bounded free text for the controller (pure), and the backstop at the gRPC boundary: a heartbeat
frame and a fault report with a detail over the controller's request limit still reach a controller
on the real chassis (which refuses any string over 4096 characters)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from motor_common.domain import EndpointHealth, EndpointStatus
from motor_common.request_limits import MAX_STRING
from motor_nodemanager.controller_client import (
    FaultLevel,
    FaultReport,
    FaultSource,
    GrpcController,
    HeartbeatFrame,
    NodeState,
)
from motor_nodemanager.detail import MAX_DETAIL, clip
from tests.nodemanager.fake_controller import serve_fake_controller

KEY = "detail-key"


def test_a_short_text_is_kept_and_control_characters_become_spaces() -> None:
    assert clip("engine exited 1") == "engine exited 1"
    assert clip("a\x00b\x1b[31mc\nd\te") == "a b [31mc\nd\te"


def test_a_long_text_keeps_its_start_and_end_around_a_marker_within_the_limit() -> None:
    text = "Traceback (most recent call last):\n" + "  frame\n" * 2000 + "RuntimeError: CUDA out of memory"
    out = clip(text)
    assert len(out) <= MAX_DETAIL
    assert out.startswith("Traceback (most recent call last):")
    assert out.endswith("RuntimeError: CUDA out of memory")
    cut = int(out.split("…[")[1].split(" ")[0])
    assert len(out) - len(f" …[{cut} characters cut]… ") + cut == len(text)  # says exactly how much is missing
    for n in (MAX_DETAIL, MAX_DETAIL + 1, 10 * MAX_DETAIL, 10**6):
        assert len(clip("x" * n)) <= MAX_DETAIL


async def test_a_heartbeat_and_a_fault_report_with_an_over_long_detail_reach_the_controller() -> None:
    server, impl = await serve_fake_controller(key=KEY)
    peer = GrpcController(f"127.0.0.1:{server.port}", KEY)
    long = "y" * (MAX_STRING + 2000)
    try:
        ack = await peer.report_fault(FaultReport("n", 1, 0, FaultLevel.ENGINE_DEAD, FaultSource.HEALTH_PROBE,
                                                  pid=9, detail=long), timeout=5)  # fmt: skip
        assert ack.accepted and len(impl.faults[0].detail) <= MAX_DETAIL

        async def frames() -> AsyncIterator[HeartbeatFrame]:
            yield HeartbeatFrame("n", NodeState.RUNNING, 1,
                                 (EndpointHealth(0, EndpointStatus.ABNORMAL, 1, 9, True, long),))  # fmt: skip
            await asyncio.Event().wait()

        stream = peer.heartbeat(frames())
        assert (await asyncio.wait_for(anext(stream), 10)).sequence == 1
        assert len(impl.frames[0].endpoints[0].detail) <= MAX_DETAIL
        await stream.aclose()
    finally:
        await peer.close()
        await server.stop(0)
