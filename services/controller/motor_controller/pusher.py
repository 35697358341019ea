"""Event pusher I/O: one loop per coordinator, driven by the pure rules in ``push_plan``.

Each coordinator has its own client (channel), :class:`~push_plan.SyncState` and persisted
generation. The loop wakes when poked (desired view changed) or on its timers: a periodic full
check (``sync_interval_sec``: the coordinator's list + generation vs what we believe is synced)
and a bounded retry of a pending SET (``set_retry_interval_sec``). A check that fails (the
coordinator restarting, say) is retried after 0.25 s, doubling up to 1 s, so a restarted
coordinator gets its SET within about a second of answering again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace

import orjson

from motor_common.domain import Instance
from motor_common.errors import MotorError
from motor_controller.codec import KEYS
from motor_controller.peers import CoordinatorClient
from motor_controller.push_plan import (
    OpKind,
    SyncState,
    after_failure,
    after_success,
    check,
    plan_ops,
    unknown_history,
)
from motor_controller.store import Store

log = logging.getLogger(__name__)

CHECK_WARN_EVERY = 30.0  # seconds between repeated "cannot read the coordinator" warnings
# After a failed check the next comes this soon, doubling per failure up to CHECK_RETRY_MAX (or
# sync_interval, if shorter): a restarted coordinator serves nothing until its first SET, so it must
# not wait a whole interval. A check of a coordinator that is down is one failed call (the channel
# reconnects with its own back-off, at most 2 s: grpc_client).
CHECK_RETRY_FIRST = 0.25
CHECK_RETRY_MAX = 1.0


class CoordinatorPusher:
    def __init__(
        self,
        client: CoordinatorClient,
        desired: Callable[[], dict[int, Instance]],
        store: Store,
        *,
        sync_interval: float,
        set_retry_interval: float,
        clock: Callable[[], float] = time.monotonic,
        hold_until: Callable[[], float] = lambda: 0.0,
        knows: Callable[[int], bool] = lambda iid: True,
    ) -> None:
        self.client = client
        # Until this clock time no instance the controller has no record of (``knows``) is taken
        # away from the coordinator (the controller's re-attach grace: it may not know the fleet
        # yet); see push_plan's module docstring.
        self._hold_until = hold_until
        self._knows = knows
        self._desired = desired
        self._store = store
        self._sync_interval = sync_interval
        self._set_retry = set_retry_interval
        self._clock = clock
        self._wake = asyncio.Event()
        self._next_check = 0.0
        self.state = SyncState()
        self.pushes: dict[str, int] = {}  # op kind -> successful count (observability, tests)
        # When the coordinator's list stopped answering (None = it answers); repeated warnings are
        # spaced by CHECK_WARN_EVERY so a coordinator that cannot be synced is visible in the log.
        self.check_failing_since: float | None = None
        self._check_warned_at = 0.0
        self._check_retry = CHECK_RETRY_FIRST

    @property
    def key(self) -> str:
        return f"{KEYS.COORDINATOR}{self.client.address}"

    async def load(self) -> None:
        raw = await self._store.get(self.key)
        if raw is not None:
            self.state = SyncState(generation=int(orjson.loads(raw)["generation"]))

    def poke(self) -> None:
        self._wake.set()

    def request_full_set(self, *, reconnect: bool = False) -> None:
        """Enqueue one full SET now (e.g. a standby coordinator was promoted); with *reconnect*,
        re-open the client's channel first (a call cut short by that is retried at once)."""
        if reconnect:
            self.client.reconnect()
        self.state = replace(self.state, full_set_pending=True, set_retry_at=0.0)
        self._wake.set()

    async def check_now(self) -> None:
        gen, view = await self.client.list_instances()
        if unknown_history(self.state, gen, view):
            log.warning(
                "the coordinator holds instances this controller has no record of (an empty or new store?): "
                "nothing is taken from it until the fleet has re-attached",
                extra={"coordinator": self.client.address, "coordinator_generation": gen,
                       "instances": sorted(view)[:20], "instance_count": len(view)},
            )
        self.state = check(self.state, gen, view)

    async def flush(self) -> None:
        """Send the operations that bring the coordinator to the desired view (one round)."""
        now = self._clock()
        holding = now < self._hold_until()
        for op in plan_ops(self.state, self._desired(), now, hold=lambda iid: holding and not self._knows(iid)):
            epoch = self.client.epoch
            try:
                generation = await self.client.apply(op)
            except MotorError as exc:
                self.state = after_failure(self.state, op, self._clock(), self._set_retry)
                if self.client.epoch != epoch:  # cut short by our own reconnect: not a failed SET
                    self.state = replace(self.state, set_retry_at=0.0)
                    self._wake.set()
                if op.kind is OpKind.SET:
                    self._next_check = 0.0  # learn the coordinator's generation before retrying
                log.warning(
                    "push to coordinator failed",
                    extra={"coordinator": self.client.address, "op": op.kind.value, "generation": op.generation,
                           "error": exc.message, "reason": exc.reason},
                )
                return
            self.state = after_success(self.state, op, generation)
            self.pushes[op.kind.value] = self.pushes.get(op.kind.value, 0) + 1
            try:
                await self._store.put(self.key, orjson.dumps({"generation": self.state.generation}))
            except MotorError as exc:  # store down: the push stands, the generation is in memory
                log.warning("could not persist the coordinator generation",
                            extra={"coordinator": self.client.address, "error": exc.message})
            log.info(
                "pushed to coordinator",
                extra={"coordinator": self.client.address, "op": op.kind.value, "generation": generation,
                       "instances": [i.id for i in op.instances]},
            )

    async def run(self) -> None:
        while True:
            self._wake.clear()  # pokes during this round make the wait below return at once
            try:
                await self._round()
            except Exception:  # a bug must not end pushes to this coordinator for good
                log.exception("push round failed; checking again after the retry interval",
                              extra={"coordinator": self.client.address})
                self._next_check = 0.0  # re-learn the coordinator's list before pushing again
                await asyncio.sleep(self._set_retry)
                continue
            now = self._clock()
            wait = self._next_check - now
            if self.state.full_set_pending:
                wait = min(wait, max(self.state.set_retry_at - now, 0.0))
            if now < self._hold_until():  # the held removals go out when the hold ends
                wait = min(wait, self._hold_until() - now)
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._wake.wait()

    async def _round(self) -> None:
        now = self._clock()
        if now >= self._next_check:
            self._next_check = now + self._sync_interval
            try:
                await self.check_now()
            except MotorError as exc:
                self._check_failed(exc, now)
                self._next_check = now + min(self._check_retry, self._sync_interval)
                self._check_retry = min(self._check_retry * 2, CHECK_RETRY_MAX)
            else:
                self._check_retry = CHECK_RETRY_FIRST
                if self.check_failing_since is not None:
                    log.info("coordinator answers again", extra={
                        "coordinator": self.client.address, "after_sec": round(now - self.check_failing_since, 1)})
                self.check_failing_since = None
        await self.flush()

    def _check_failed(self, exc: MotorError, now: float) -> None:
        first = self.check_failing_since is None
        if first:
            self.check_failing_since = now
        if first or now - self._check_warned_at >= CHECK_WARN_EVERY:
            self._check_warned_at = now
            assert self.check_failing_since is not None
            log.warning(
                "cannot read the coordinator's instance list: it cannot be synced until this succeeds",
                extra={"coordinator": self.client.address, "error": exc.message, "reason": exc.reason,
                       "failing_for_sec": round(now - self.check_failing_since, 1)},
            )
