"""TaskOwner: what it says about tasks that end on their own."""

from __future__ import annotations

import asyncio
import logging

import pytest

from motor_common.tasks import TaskOwner
from tests.helpers import SurvivesOneCancel


async def test_a_stray_cancelled_error_is_logged_but_a_requested_cancel_is_not(caplog: pytest.LogCaptureFixture) -> None:
    owner = TaskOwner("t")

    async def stray() -> None:  # what a grpc.aio call raises when its channel is closed under it
        raise asyncio.CancelledError

    async def forever() -> None:
        await asyncio.Event().wait()

    caplog.set_level(logging.ERROR, logger="motor_common.tasks")
    a = owner.spawn(stray(), name="stray")
    b = owner.spawn(forever(), name="forever")
    await asyncio.wait({a})
    await asyncio.sleep(0)  # let b start
    b.cancel()  # requested: e.g. a strategy stopped because its instance was deleted
    await asyncio.wait({b})
    await asyncio.sleep(0)  # done callbacks run on the next loop iteration
    logged = [(r.getMessage(), getattr(r, "task", "")) for r in caplog.records]
    assert logged == [("background task ended by a CancelledError nobody requested", "stray")]
    assert len(owner) == 0
    await owner.close()


async def test_a_crash_is_logged_with_its_exception(caplog: pytest.LogCaptureFixture) -> None:
    owner = TaskOwner("t")

    async def boom() -> None:
        raise RuntimeError("boom")

    caplog.set_level(logging.ERROR, logger="motor_common.tasks")
    t = owner.spawn(boom(), name="boom")
    await asyncio.wait({t})
    await asyncio.sleep(0)
    assert [r.getMessage() for r in caplog.records] == ["background task crashed"]
    assert caplog.records[0].exc_info is not None and "boom" in str(caplog.records[0].exc_info[1])
    await owner.close()


async def test_close_ends_a_task_that_survived_its_first_cancellation() -> None:
    """As a loop whose asyncio.wait_for swallowed the cancel (Python 3.11, the cancel arriving as
    the inner call completes) would: close cancels again until the task has ended."""
    owner = TaskOwner("t")
    stubborn = SurvivesOneCancel()
    t = owner.spawn(stubborn(), name="stubborn")
    await asyncio.wait_for(stubborn.running.wait(), 5)
    await owner.close(timeout=30)
    assert stubborn.swallowed == 1 and t.cancelled() and len(owner) == 0
