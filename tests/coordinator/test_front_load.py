"""The front workers' shared view of load, without sockets: the coordinator's sum of the workers'
reports (``front_load``), what one worker's scheduler makes of the others' load, and the sync
hub's messages (``front_sync.FrontSync``: what is sent, coalesced, to which stream)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from motor_common.domain import InstanceStatus, Role
from motor_common.gen.motor.coordinator.v1 import front_worker_pb2 as fpb
from motor_common.leadership import LeaderRole
from motor_coordinator.config import SchedulerConfig
from motor_coordinator.front_load import LoadTable
from motor_coordinator.front_sync import FrontSync, _Stream, loads_to_pb, registry_to_pb
from motor_coordinator.front_worker import MirroredLeadership, registry_from_pb
from motor_coordinator.leadership import Standalone
from motor_coordinator.policies import RequestInfo, make_policy
from motor_coordinator.registry import RegistryState, set_instances
from motor_coordinator.scheduler import Scheduler, endpoint_key
from tests.coordinator.factories import inst

A, B = ("127.0.0.1", 9001), ("127.0.0.1", 9002)


def test_others_is_the_sum_of_every_other_workers_last_report() -> None:
    t = LoadTable()
    assert t.report(0, {A: (2, 100)})
    assert t.report(1, {A: (1, 10), B: (3, 0)})
    assert not t.report(1, {A: (1, 10), B: (3, 0)})  # the same again: nothing to send
    assert t.others(0) == {A: (1, 10), B: (3, 0)}
    assert t.others(1) == {A: (2, 100)}
    assert t.total() == {A: (3, 110), B: (3, 0)}
    assert t.report(1, {A: (0, 0)})  # idle now: the row goes
    assert t.others(0) == {}
    assert t.forget(0) and not t.forget(0)
    assert t.total() == {}


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


async def test_own_loads_are_this_process_only_and_each_change_is_signalled() -> None:
    s = _scheduler()
    changes: list[int] = []
    s.on_load_change = lambda: changes.append(1)
    p1 = s.state.instances[1].endpoints[0]
    s.set_peer_loads({endpoint_key(p1): (5, 0)})
    route = s.route(RequestInfo(0, "m"))
    async with s.load_guard(route.prefill, tokens=7):
        assert s.own_loads() == {endpoint_key(route.prefill.endpoint): (1, 7)}  # type: ignore[union-attr]
    assert s.own_loads() == {}
    assert len(changes) == 2  # in, out


def _hub() -> tuple[FrontSync, list[RegistryState]]:
    states = [set_instances(RegistryState(), [inst(1, Role.PREFILL), inst(3, Role.DECODE)], 4)]
    return FrontSync(lambda: states[-1], Standalone(), frozenset), states


def _report(worker: int, loads: dict[tuple[str, int], tuple[int, int]]) -> fpb.SyncRequest:
    return fpb.SyncRequest(worker_index=worker, loads=loads_to_pb(loads))


async def test_a_stream_gets_everything_first_then_only_what_changed() -> None:
    hub, states = _hub()
    s0, s1 = _Stream(0), _Stream(1)
    hub._streams += [s0, s1]
    first = hub.message(s0)
    assert {f.name for f, _ in first.ListFields()} == {"registry", "leadership", "alarms", "peers"}
    assert registry_from_pb(first.registry) == states[-1]
    assert not s0.due()
    hub.message(s1)
    # worker 1 reports load: worker 0 is due the peers (only), worker 1 nothing
    hub.report(s1, _report(1, {A: (2, 0)}))
    assert s0.due() and s0.wake.is_set() and not s1.due()
    msg = hub.message(s0)
    assert {f.name for f, _ in msg.ListFields()} == {"peers"}
    assert [(m.ip, m.port, m.in_flight) for m in msg.peers.loads] == [("127.0.0.1", 9001, 2)]
    # two registry changes before the next send: one message, the latest state
    states.append(set_instances(states[-1], [inst(1, Role.PREFILL)], 5))
    hub.registry_changed()
    states.append(set_instances(states[-1], [inst(1, Role.PREFILL), inst(4, Role.DECODE)], 6))
    hub.registry_changed()
    msg = hub.message(s0)
    assert {f.name for f, _ in msg.ListFields()} == {"registry"}
    assert msg.registry.generation == 6 and registry_from_pb(msg.registry) == states[-1]


async def test_the_coordinator_counts_the_whole_fronts_load_and_forgets_a_gone_worker() -> None:
    hub, _ = _hub()
    totals: list[dict[tuple[str, int], tuple[int, int]]] = []
    hub.on_loads = totals.append

    async def reports(*msgs: fpb.SyncRequest) -> asyncio.Queue[fpb.SyncRequest | None]:
        q: asyncio.Queue[fpb.SyncRequest | None] = asyncio.Queue()
        for m in msgs:
            q.put_nowait(m)
        return q

    async def stream(q: asyncio.Queue[fpb.SyncRequest | None]):  # type: ignore[no-untyped-def]
        while (m := await q.get()) is not None:
            yield m

    q0 = await reports(_report(0, {A: (1, 0)}))
    q1 = await reports(_report(1, {A: (2, 0), B: (1, 0)}))
    out0 = hub.serve(stream(q0))
    out1 = hub.serve(stream(q1))
    assert (await anext(out0)).HasField("registry")
    assert (await anext(out1)).HasField("registry")
    # each stream's next message carries the other's load once both reports were read
    msg = await asyncio.wait_for(anext(out1), 5)
    while not (msg.HasField("peers") and msg.peers.loads):
        msg = await asyncio.wait_for(anext(out1), 5)
    assert {(m.port, m.in_flight) for m in msg.peers.loads} == {(9001, 1)}
    assert totals[-1] == {A: (3, 0), B: (1, 0)}
    # worker 0's stream ends (the worker died): its load no longer counts
    q0.put_nowait(None)
    with pytest.raises(StopAsyncIteration):
        while True:
            await asyncio.wait_for(anext(out0), 5)
    assert totals[-1] == {A: (2, 0), B: (1, 0)}
    assert hub.workers == 1
    await out1.aclose()
    assert hub.workers == 0


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
