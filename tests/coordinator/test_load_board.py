"""The front workers' shared view of load, without sockets: the shared-memory board
(``load_board``: rows, epochs, the refresh interval), what one worker's scheduler makes of the
others' load, and the sync hub's messages (``front_sync.FrontSync``: what is sent, coalesced, to
which stream)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from motor_common.domain import InstanceStatus, Role
from motor_common.gen.motor.coordinator.v1 import front_worker_pb2 as fpb
from motor_common.leadership import LeaderRole
from motor_coordinator.config import SchedulerConfig
from motor_coordinator.front_sync import FrontSync, _Stream, registry_to_pb
from motor_coordinator.front_worker import MirroredLeadership, registry_from_pb
from motor_coordinator.leadership import Standalone
from motor_coordinator.load_board import (
    MAX_ENDPOINTS,
    READ_BUDGET,
    LoadBoard,
    endpoint_keys,
    slot_order,
)
from motor_coordinator.policies import RequestInfo, make_policy
from motor_coordinator.registry import RegistryState, set_instances
from motor_coordinator.scheduler import Scheduler, endpoint_key
from tests.coordinator.factories import inst

A, B = ("127.0.0.1", 9001), ("127.0.0.1", 9002)


def _boards(tmp_path: Path, rows: int = 3) -> tuple[LoadBoard, list[LoadBoard], list[float]]:
    now = [0.0]
    coordinator = LoadBoard.create(str(tmp_path / "board"), rows)
    coordinator._clock = lambda: now[0]
    # Reads take no time by this timer: with the real one a read preempted on a busy machine pushes the
    # next read READ_BUDGET times its duration away, past the refresh these tests step the clock by.
    coordinator._timer = lambda: 0.0
    workers = [LoadBoard(str(tmp_path / "board"), rows, i, clock=lambda: now[0], timer=lambda: 0.0)
               for i in range(rows)]
    return coordinator, workers, now


def test_a_reader_sums_the_other_rows_of_its_epoch(tmp_path: Path) -> None:
    coordinator, (w0, w1, w2), now = _boards(tmp_path)
    for b in (coordinator, w0, w1, w2):
        b.set_endpoints([B, A])
    w0.write(A, 2, 100)
    w1.write(A, 1, 10)
    w1.write(B, 3, 0)
    assert w2.others() == {A: (3, 110), B: (3, 0)}
    assert w0.others(force=True) == {A: (1, 10), B: (3, 0)}  # not its own row
    assert coordinator.others() == {A: (3, 110), B: (3, 0)}  # every row
    # read again within refresh_sec, or nothing changed: None (the caller keeps what it has)
    w1.write(A, 5, 10)
    assert w2.others() is None
    now[0] += w2.refresh_sec
    assert w2.others() == {A: (7, 110), B: (3, 0)}
    now[0] += w2.refresh_sec
    assert w2.others() is None  # unchanged
    # a writer that has not applied the same instance set yet is skipped, then counted again
    w1.set_endpoints([A, B, ("127.0.0.1", 9003)], own={A: (5, 10)})
    assert w2.others(force=True) == {A: (2, 100)}
    w2.set_endpoints([A, B, ("127.0.0.1", 9003)])
    w0.set_endpoints([A, B, ("127.0.0.1", 9003)], own={A: (2, 100)})
    assert w2.others(force=True) == {A: (7, 110)}  # w1's row was rewritten under the new slots
    # a worker that died: its row no longer counts
    coordinator.clear_row(1)
    assert w2.others(force=True) == {A: (2, 100)}
    coordinator.clear_row(3)  # not a row of this board (a bogus hello): nothing happens
    coordinator.clear_row(-1)
    assert w2.others(force=True) is None
    for b in (coordinator, w0, w1, w2):
        b.close()


def test_a_slow_read_puts_the_next_one_further_away(tmp_path: Path) -> None:
    """A read that took 0.5 ms (a large fleet) is not repeated for READ_BUDGET x 0.5 ms, not 1 ms."""
    now, ticks = [0.0], iter([0.0, 0.0005, 1.0, 1.0001])
    board = LoadBoard.create(str(tmp_path / "board"), 2)
    reader = LoadBoard(str(tmp_path / "board"), 2, 0, clock=lambda: now[0], timer=lambda: next(ticks))
    writer = LoadBoard(str(tmp_path / "board"), 2, 1)
    for b in (reader, writer):
        b.set_endpoints([A])
    writer.write(A, 1, 0)
    assert reader.others() == {A: (1, 0)}  # took 0.5 ms
    writer.write(A, 2, 0)
    now[0] = 0.002
    assert reader.others() is None  # 2 ms later: still within 10 x 0.5 ms
    now[0] = READ_BUDGET * 0.0005
    assert reader.others() == {A: (2, 0)}  # took 0.1 ms: the next one 1 ms later again
    for b in (board, reader, writer):
        b.close()


def test_slots_and_epoch_are_the_same_in_every_process_and_bounded() -> None:
    keys = [("10.0.0.2", 1), ("10.0.0.1", 2), ("10.0.0.1", 1)]
    order, epoch = slot_order(keys)
    assert order == sorted(keys) and slot_order(reversed(keys)) == (order, epoch) and epoch > 0
    assert slot_order(keys[:2])[1] != epoch
    many = [("10.0.0.1", p) for p in range(MAX_ENDPOINTS + 5)]
    assert len(slot_order(many)[0]) == MAX_ENDPOINTS


def test_an_endpoint_beyond_the_boards_slots_is_counted_by_its_own_worker_only(tmp_path: Path) -> None:
    _, (w0, w1, _w2), _ = _boards(tmp_path)
    w0.set_endpoints([A])
    w1.set_endpoints([A])
    w0.write(B, 4, 0)  # no slot for B
    assert w1.others(force=True) == {}


def _scheduler(policy: str = "least_load") -> Scheduler:
    s = Scheduler(make_policy(SchedulerConfig(policy=policy)))
    s.accept(set_instances(RegistryState(), [inst(1, Role.PREFILL), inst(2, Role.PREFILL),
                                             inst(3, Role.DECODE), inst(4, Role.DECODE)], 0))
    return s


@pytest.mark.parametrize("seq", range(4))
def test_least_load_counts_the_other_workers_requests(seq: int) -> None:
    s = _scheduler()
    p1, d3 = s.state.instances[1].endpoints[0], s.state.instances[3].endpoints[0]
    s.set_peer_loads({endpoint_key(p1): (2, 500), endpoint_key(d3): (1, 0)})
    route = s.route(RequestInfo(seq, "m"))  # the fast path (indexed live sets)
    assert route.prefill is not None and route.decode is not None
    assert (route.prefill.instance.id, route.decode.instance.id) == (2, 4)
    assert s.inflight(p1) == 2 and s.queued_tokens(p1) == 500
    cands = {c.instance.id: c for c in s.holders([Role.PREFILL], "m")}  # the candidate path
    assert (cands[1].inflight, cands[1].queued_tokens) == (2, 500)
    # The others went idle: a tie again (round robin by sequence number).
    s.set_peer_loads({})
    assert {s.route(RequestInfo(i, "m")).decode.instance.id for i in range(2)} == {3, 4}  # type: ignore[union-attr]


def test_route_reads_the_board_before_it_chooses(tmp_path: Path) -> None:
    _, (w0, w1, _w2), now = _boards(tmp_path)
    s = _scheduler()
    keys = endpoint_keys(s.state.instances.values())
    w0.set_endpoints(keys)
    w1.set_endpoints(keys)
    s.peer_source = lambda force: w0.others(force=force)
    d3 = endpoint_key(s.state.instances[3].endpoints[0])
    w1.write(d3, 1, 0)  # another worker's request on decode 3
    assert {s.route(RequestInfo(i, "m")).decode.instance.id for i in range(4)} == {4}  # type: ignore[union-attr]
    w1.write(d3, 0, 0)
    now[0] += w0.refresh_sec
    assert {s.route(RequestInfo(i, "m")).decode.instance.id for i in range(4)} == {3, 4}  # type: ignore[union-attr]


async def test_own_loads_are_this_process_only_and_each_change_is_signalled() -> None:
    s = _scheduler()
    changes: list[tuple[tuple[str, int], int, int]] = []
    s.on_load_change = lambda k, n, t: changes.append((k, n, t))
    p1 = s.state.instances[1].endpoints[0]
    s.set_peer_loads({endpoint_key(p1): (5, 0)})
    route = s.route(RequestInfo(0, "m"))
    async with s.load_guard(route.prefill, tokens=7):
        assert s.own_loads() == {endpoint_key(route.prefill.endpoint): (1, 7)}  # type: ignore[union-attr]
    assert s.own_loads() == {}
    key = endpoint_key(route.prefill.endpoint)  # type: ignore[union-attr]
    assert changes == [(key, 1, 7), (key, 0, 0)]  # in, out: this process's own figures


def _hub() -> tuple[FrontSync, list[RegistryState]]:
    states = [set_instances(RegistryState(), [inst(1, Role.PREFILL), inst(3, Role.DECODE)], 4)]
    return FrontSync(lambda: states[-1], Standalone(), frozenset), states


async def test_a_stream_gets_everything_first_then_only_what_changed() -> None:
    hub, states = _hub()
    s0, s1 = _Stream(), _Stream()
    hub._streams += [s0, s1]
    first = hub.message(s0)
    assert {f.name for f, _ in first.ListFields()} == {"registry", "leadership", "alarms"}
    assert registry_from_pb(first.registry) == states[-1]
    assert not s0.due()
    # two registry changes before the next send: one message, the latest state
    states.append(set_instances(states[-1], [inst(1, Role.PREFILL)], 5))
    hub.registry_changed()
    states.append(set_instances(states[-1], [inst(1, Role.PREFILL), inst(4, Role.DECODE)], 6))
    hub.registry_changed()
    assert s0.wake.is_set() and s1.due()
    msg = hub.message(s0)
    assert {f.name for f, _ in msg.ListFields()} == {"registry"}
    assert msg.registry.generation == 6 and registry_from_pb(msg.registry) == states[-1]
    hub.alarms_changed()
    assert {f.name for f, _ in hub.message(s0).ListFields()} == {"alarms"}


async def test_a_streams_end_names_the_gone_worker() -> None:
    hub, _ = _hub()
    gone: list[int] = []
    hub.on_worker_gone = gone.append
    q: asyncio.Queue[fpb.SyncRequest | None] = asyncio.Queue()
    q.put_nowait(fpb.SyncRequest(worker_index=1))

    async def requests() -> AsyncIterator[fpb.SyncRequest]:
        while (m := await q.get()) is not None:
            yield m

    out = hub.serve(requests())
    assert (await anext(out)).HasField("registry")
    assert hub.workers == 1
    q.put_nowait(None)  # the worker's side ended (it died)
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(out), 5)
    assert gone == [1] and hub.workers == 0


def test_the_registry_keeps_every_status_and_the_leadership_mirror_serves_only_when_known() -> None:
    state = set_instances(RegistryState(), [inst(1, Role.PREFILL), inst(3, Role.DECODE)], 9)
    paused = replace(state, instances={**state.instances, 3: replace(state.instances[3],
                                                                     status=InstanceStatus.PAUSED)})
    back = registry_from_pb(registry_to_pb(paused))
    assert back.instances[3].status is InstanceStatus.PAUSED and back.generation == 9 and back.authoritative
    lead = MirroredLeadership()
    seen: list[bool] = []
    lead.subscribe(lambda: seen.append(lead.is_master))
    assert not lead.is_master  # nothing heard from the coordinator yet
    lead.set(LeaderRole.STANDBY, False, True)
    lead.set(LeaderRole.MASTER, False, True)
    assert seen == [False, True]
