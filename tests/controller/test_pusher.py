"""CoordinatorPusher against an in-memory coordinator that applies the generation rules."""

from __future__ import annotations

from collections.abc import Sequence

from motor_common.domain import Endpoint, EngineType, Instance, InstanceStatus, Role
from motor_common.errors import Aborted, FailedPrecondition, Unavailable
from motor_controller.push_plan import Op, OpKind
from motor_controller.pusher import CoordinatorPusher
from motor_controller.store import MemoryStore


def inst(iid: int) -> Instance:
    return Instance(iid, Role.DECODE, f"j{iid}", "m", EngineType.SGLANG, (Endpoint(0, "10.0.0.1", 9000 + iid),))


class MemoryCoordinator:
    address = "mem:1"

    def __init__(self) -> None:
        self.epoch = 0
        self.generation = 0
        self.instances: dict[int, Instance] = {}
        self.calls: list[tuple[str, int]] = []
        self.down = False
        self.fail_kinds: set[OpKind] = set()
        self.master_at: str | None = None  # what its GetReadiness says: master at this address

    async def apply(self, op: Op) -> int:
        self.calls.append((op.kind.value, op.generation))
        if self.down or op.kind in self.fail_kinds:
            raise Unavailable("down")
        if op.kind is OpKind.SET:
            if op.generation < self.generation:
                raise Aborted("stale", reason="STALE_GENERATION")
            self.instances = {i.id: i for i in op.instances}
            self.generation = op.generation
            return self.generation
        if op.generation <= self.generation:
            raise Aborted("stale", reason="STALE_GENERATION")
        if op.generation > self.generation + 1:
            raise FailedPrecondition("gap", reason="GENERATION_GAP")
        for i in op.instances:
            if op.kind is OpKind.ADD:
                self.instances[i.id] = i
            elif op.kind is OpKind.DEL:
                self.instances.pop(i.id)
            else:
                status = InstanceStatus.PAUSED if op.kind is OpKind.PAUSE else InstanceStatus.AVAILABLE
                self.instances[i.id] = Instance(**{**i.__dict__, "status": status})
        self.generation = op.generation
        return self.generation

    async def list_instances(self) -> tuple[int, dict[int, Instance]]:
        if self.down:
            raise Unavailable("down")
        return self.generation, dict(self.instances)

    async def clear_precision_alarms(self, instance_ids: Sequence[int]) -> None:
        return None

    async def master_address(self) -> str | None:
        return None if self.down else self.master_at

    def reconnect(self) -> None:
        self.epoch += 1

    async def close(self) -> None:
        return None


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


async def test_increments_then_restart_gap_falls_back_to_one_full_set_and_persists_generation() -> None:
    coord, store, clock = MemoryCoordinator(), MemoryStore(), Clock()
    desired: dict[int, Instance] = {1: inst(1)}
    p = CoordinatorPusher(coord, lambda: desired, store, sync_interval=5, set_retry_interval=1, clock=clock)
    await p.flush()  # unknown state: SET
    desired[2] = inst(2)
    await p.flush()  # ADD
    assert coord.calls == [("set", 1), ("add", 2)] and set(coord.instances) == {1, 2}
    assert store.data["coordinators/mem:1"] == b'{"generation":2}'

    restarted = MemoryCoordinator()  # generation 0, empty, same address
    p.client = restarted
    desired[3] = inst(3)
    await p.flush()  # ADD gen 3 → GENERATION_GAP → one coalesced SET pending
    assert restarted.calls == [("add", 3)] and p.state.full_set_pending
    await p.flush()
    assert restarted.calls[-1] == ("set", 3) and set(restarted.instances) == {1, 2, 3}


async def test_failed_set_waits_for_the_retry_interval_and_keeps_the_fingerprint() -> None:
    coord, clock = MemoryCoordinator(), Clock()
    desired = {1: inst(1)}
    p = CoordinatorPusher(coord, lambda: desired, MemoryStore(), sync_interval=5, set_retry_interval=1, clock=clock)
    coord.down = True
    await p.flush()
    fp = p.state.fingerprint
    await p.flush()
    await p.flush()
    assert coord.calls == [("set", 1)] and p.state.fingerprint == fp  # no recursive retries
    clock.t += 1.0
    coord.down = False
    await p.flush()
    assert coord.calls == [("set", 1), ("set", 1)] and coord.instances == desired


async def test_periodic_check_repairs_a_coordinator_changed_behind_our_back() -> None:
    coord, clock = MemoryCoordinator(), Clock()
    desired = {1: inst(1)}
    p = CoordinatorPusher(coord, lambda: desired, MemoryStore(), sync_interval=5, set_retry_interval=1, clock=clock)
    await p.flush()
    coord.instances[99] = inst(99)  # an operator's CLI write bumps its generation
    coord.generation += 1
    await p.check_now()
    await p.flush()
    assert coord.calls[-1] == ("set", 3) and set(coord.instances) == {1}


async def test_promotion_reconnects_and_sets_at_once_even_while_a_failed_set_waits() -> None:
    coord, clock = MemoryCoordinator(), Clock()
    desired = {1: inst(1)}
    p = CoordinatorPusher(coord, lambda: desired, MemoryStore(), sync_interval=5, set_retry_interval=1, clock=clock)
    coord.down = True
    await p.flush()
    coord.down = False
    await p.flush()
    assert coord.calls == [("set", 1)]  # still waiting for the retry interval
    p.request_full_set(reconnect=True)
    await p.flush()
    assert coord.epoch == 1 and coord.calls == [("set", 1), ("set", 1)] and coord.instances == desired


class ReconnectDuringCall(MemoryCoordinator):
    async def apply(self, op: Op) -> int:
        if not self.calls:
            self.calls.append((op.kind.value, op.generation))
            self.reconnect()  # what a promotion does while this call is in flight
            raise Unavailable("cancelled by reconnect")
        return await super().apply(op)


async def test_a_set_cut_short_by_our_own_reconnect_is_retried_without_waiting() -> None:
    coord, clock = ReconnectDuringCall(), Clock()
    desired = {1: inst(1)}
    p = CoordinatorPusher(coord, lambda: desired, MemoryStore(), sync_interval=5, set_retry_interval=1, clock=clock)
    await p.flush()
    assert p.state.full_set_pending and p.state.set_retry_at == 0.0
    await p.flush()  # same clock: no retry interval waited
    assert coord.calls == [("set", 1), ("set", 1)] and coord.instances == desired


class DownStore(MemoryStore):
    async def put(self, key: str, value: bytes) -> None:
        raise Unavailable("etcd down", reason="STORE_UNAVAILABLE")


async def test_a_push_stands_when_the_store_cannot_persist_the_generation() -> None:
    coord, clock = MemoryCoordinator(), Clock()
    desired = {1: inst(1)}
    p = CoordinatorPusher(coord, lambda: desired, DownStore(), sync_interval=5, set_retry_interval=1, clock=clock)
    await p.flush()
    desired[2] = inst(2)
    await p.flush()
    assert coord.calls == [("set", 1), ("add", 2)] and p.state.generation == 2


async def test_a_failed_check_is_retried_soon_then_backs_off_and_a_restarted_coordinator_is_set_at_once() -> None:
    """A coordinator that restarts serves nothing until its first SET: a failed check is retried
    after 0.25 s, doubling up to 1 s, and the first check that answers again sets the coordinator
    in the same round; answering, it is checked every sync_interval (5 s) again."""
    coord, clock = MemoryCoordinator(), Clock()
    desired = {1: inst(1)}
    p = CoordinatorPusher(coord, lambda: desired, MemoryStore(), sync_interval=5, set_retry_interval=1, clock=clock)
    await p._round()
    assert set(coord.instances) == {1}
    coord.down = True
    clock.t = p._next_check  # the periodic check finds it down
    gaps = []
    for _ in range(7):
        start = clock.t
        await p._round()
        gaps.append(p._next_check - start)
        clock.t = p._next_check
    assert gaps == [0.25, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
    coord.down, coord.instances, coord.generation = False, {}, 0  # restarted: empty, generation 0
    await p._round()
    assert set(coord.instances) == {1} and p.check_failing_since is None
    assert p._next_check - clock.t == 5  # answering again: back to the periodic check
    coord.down = True
    clock.t = p._next_check
    await p._round()
    assert p._next_check - clock.t == 0.25  # the back-off starts over
