"""The controller's reconcile loop ends when it is cancelled, even when the cancellation arrives in
the loop iteration in which its wake-up does. Python 3.11's ``asyncio.wait_for`` returned the
wake-up then and the loop went on reconciling after shutdown (the race that hung
``EtcdElection.stop()``); the loop's wait is an ``asyncio.timeout`` now. Real Controller, in-memory
store."""

from __future__ import annotations

import asyncio

from motor_controller.config import ControllerConfig
from motor_controller.controller import Controller
from motor_controller.store import MemoryStore
from tests.controller.test_push_targets import NoNodeManagers
from tests.helpers import wait_for


async def test_a_cancel_arriving_with_a_wake_up_ends_the_reconcile_loop() -> None:
    ctl = Controller(ControllerConfig(), MemoryStore(), NoNodeManagers())  # type: ignore[arg-type]
    rounds = 0
    reconcile_once = ctl.reconcile_once

    async def counted() -> None:
        nonlocal rounds
        rounds += 1
        await reconcile_once()

    ctl.reconcile_once = counted  # type: ignore[method-assign]
    task = asyncio.create_task(ctl._reconcile_loop())
    try:
        # the loop has reconciled once and now waits for its wake-up (a waiter on the event)
        await wait_for(lambda: rounds == 1 and ctl._wake._waiters, what="the loop waiting")  # type: ignore[attr-defined]
        ctl.poke()  # the wake-up and the cancel in one loop iteration
        task.cancel()
        await asyncio.wait([task], timeout=10)
        assert task.done(), f"the reconcile loop survived its cancellation ({rounds} rounds)"
        assert task.cancelled() and rounds == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()
