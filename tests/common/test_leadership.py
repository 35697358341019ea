"""Leadership state machine (pure) and the etcd election against a real etcd server."""

from __future__ import annotations

import asyncio

import pytest

from motor_common import leadership as lship
from motor_common.etcd_election import EtcdElection, StepDown
from motor_common.leadership import LeaderRole
from tests.etcd_server import etcd_server
from tests.helpers import SurvivesOneCancel, wait_for


def test_first_failed_renewal_isolates_the_master_and_a_success_heals_it() -> None:
    master = lship.acquired(lship.initial_candidate(), "a")
    assert master.serving and master.term == 1
    isolated = lship.renew_failed(master)
    assert isolated.role is LeaderRole.MASTER and isolated.isolated and not isolated.serving
    assert isolated.reason == "isolated" and not isolated.store_available
    assert lship.renew_ok(isolated).serving


def test_a_standby_never_serves_and_says_why() -> None:
    standby = lship.observed_holder(lship.initial_candidate(), "b")
    assert not standby.serving and standby.reason == "Coordinator is not master"
    assert not lship.renew_failed(standby).isolated
    assert lship.lost(lship.acquired(standby, "a"), "b").role is LeaderRole.STANDBY


def test_a_master_whose_renewal_is_overdue_reads_as_isolated_until_it_renews() -> None:
    master = lship.acquired(lship.initial_candidate(), "a")
    assert lship.at(master, now=10.0, valid_until=12.0) == master
    frozen = lship.at(master, now=13.0, valid_until=12.0)
    assert frozen.isolated and frozen.role is LeaderRole.MASTER and not frozen.serving
    standby = lship.initial_candidate()
    assert lship.at(standby, now=13.0, valid_until=0.0) == standby


def test_limits_are_clamped_to_the_seed_figures() -> None:
    ttl, check, notes = lship.clamp(30, 10)
    assert (ttl, check) == (8.0, 2.0) and len(notes) == 2
    assert lship.clamp(3, 0.5) == (3, 0.5, [])


@pytest.mark.etcd
async def test_one_master_at_a_time_and_the_standby_wins_when_the_master_resigns() -> None:
    async with etcd_server() as etcd:
        a = EtcdElection([etcd.endpoint], "/motor/test/leader", "a", ttl=8, check_interval=0.2)
        b = EtcdElection([etcd.endpoint], "/motor/test/leader", "b", ttl=8, check_interval=0.2)
        await a.start()
        await wait_for(lambda: a.view.role is LeaderRole.MASTER, timeout=10, what="a master")
        await b.start()
        await wait_for(lambda: b.view.holder == "a", timeout=10, what="b sees a")
        assert b.view.role is LeaderRole.STANDBY
        await a.stop()  # resigns: revokes the lease, b wins at its next check
        # a lease left to expire would free the lock only >= ttl - ttl/3 = 5.3 s after the last
        # refresh, so b winning within 5 s is the revocation (the old bound, 1.5 s with ttl 2,
        # was a wall-clock race on a loaded box; ttl 2 also gave each etcd call only 0.67 s)
        await wait_for(lambda: b.view.role is LeaderRole.MASTER, timeout=5, what="b master")
        await b.stop()


@pytest.mark.etcd
async def test_master_isolates_when_etcd_dies_and_recovers_when_it_returns() -> None:
    async with etcd_server() as etcd:
        a = EtcdElection([etcd.endpoint], "/motor/test/leader", "a", ttl=3, check_interval=0.2)
        await a.start()
        await wait_for(lambda: a.view.role is LeaderRole.MASTER, timeout=10, what="a master")
        etcd.kill()
        await wait_for(lambda: a.view.isolated, timeout=5, what="isolated")
        assert a.view.role is LeaderRole.MASTER
        etcd.start()
        await etcd.wait_healthy()
        await wait_for(lambda: a.view.serving, timeout=15, what="a serving again")
        await a.stop()


@pytest.mark.etcd
async def test_a_candidate_that_holds_back_leaves_a_free_lock_to_one_that_may_take_it() -> None:
    """A coordinator not synced yet (``may_acquire`` says why) observes a free lock without taking
    it; a synced peer takes it; once allowed, the held-back one wins when the lock is free again."""
    hold: list[str | None] = ["not synced yet"]
    async with etcd_server() as etcd:
        b = EtcdElection([etcd.endpoint], "/motor/test/leader", "b", ttl=2, check_interval=0.1,
                         may_acquire=lambda: hold[0])
        await b.start()
        await wait_for(lambda: b.holding_back == "not synced yet", timeout=10,
                       what="b seeing the free lock and holding back")
        a = EtcdElection([etcd.endpoint], "/motor/test/leader", "a", ttl=2, check_interval=0.1)
        await a.start()
        await wait_for(lambda: a.view.role is LeaderRole.MASTER, timeout=10, what="a master")
        await wait_for(lambda: b.view.holder == "a", timeout=10, what="b sees a")
        assert b.view.role is not LeaderRole.MASTER
        hold[0] = None
        await a.stop()  # resigns: b may take the lock now
        await wait_for(lambda: b.view.role is LeaderRole.MASTER, timeout=5, what="b master")
        await b.stop()


def test_an_unsynced_coordinator_holds_back_only_until_synced_or_the_delay_passed() -> None:
    from motor_coordinator.leadership import campaign_hold

    why = campaign_hold(synced=False, waited=1.0, delay=10.0)
    assert why is not None and "not synced" in why and "10 s" in why
    assert campaign_hold(synced=True, waited=0.0, delay=10.0) is None
    assert campaign_hold(synced=False, waited=10.0, delay=10.0) is None
    assert campaign_hold(synced=False, waited=0.0, delay=0.0) is None  # 0: campaign at once


async def test_a_cancellation_arriving_as_an_etcd_call_completes_is_not_swallowed() -> None:
    """The race that hung a stop() for ever on a loaded box: the campaign task is cancelled in the
    loop iteration in which its etcd call's answer arrives. Python 3.11's asyncio.wait_for then
    returns the answer and the task goes on renewing; the call's own timeout must not do that."""
    e = EtcdElection(["127.0.0.1:1"], "/motor/test/leader", "a", ttl=2, check_interval=0.2)
    answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    call = asyncio.ensure_future(e._call(answer))
    await asyncio.sleep(0)  # one loop iteration: the call now waits for its answer
    answer.set_result("reply")
    call.cancel()  # same iteration
    with pytest.raises(asyncio.CancelledError):
        await call


async def test_stop_ends_a_campaign_that_survived_a_cancellation() -> None:
    """Whatever swallows one cancellation, stop() cancels again until the campaign has ended."""
    e = EtcdElection(["127.0.0.1:1"], "/motor/test/leader", "a", ttl=2, check_interval=0.2)
    stubborn = SurvivesOneCancel()
    task = asyncio.ensure_future(stubborn())
    e._task = task
    await asyncio.wait_for(stubborn.running.wait(), 5)
    stop = asyncio.ensure_future(e.stop())
    await asyncio.wait([stop], timeout=10)  # (not wait_for: its own cancel would end the campaign)
    try:
        assert stop.done(), "stop() still waits for a campaign that survived its cancellation"
    finally:
        stop.cancel()
        task.cancel()
    assert stubborn.swallowed == 1 and task.cancelled() and e._task is None


@pytest.mark.etcd
async def test_a_master_that_cannot_act_hands_the_lock_over_at_once() -> None:
    """``on_change`` raising StepDown (a controller whose state load failed): the lease is revoked,
    so a standby takes over well before the ttl (8 s) would have freed the lock; the one that
    stepped down keeps campaigning and holds back as ``may_acquire`` says."""
    refused: list[str] = []

    def cannot_act(view: lship.Leadership) -> None:
        if view.serving:
            refused.append(view.holder)
            raise StepDown("state unreadable")

    async with etcd_server() as etcd:
        a = EtcdElection([etcd.endpoint], "/motor/test/leader", "a", ttl=8, check_interval=0.2,
                         on_change=cannot_act, may_acquire=lambda: "its load failed" if refused else None)
        await a.start()
        await wait_for(lambda: refused == ["a"], timeout=10, what="a made master once")
        await wait_for(lambda: a.view.role is LeaderRole.STANDBY and a.holding_back == "its load failed",
                       timeout=5, what="a stepped down and holding back")
        b = EtcdElection([etcd.endpoint], "/motor/test/leader", "b", ttl=8, check_interval=0.2)
        await b.start()
        # a lease left to expire would free the lock only >= 8 s after a's last refresh
        await wait_for(lambda: b.view.role is LeaderRole.MASTER, timeout=5, what="b master")
        await wait_for(lambda: a.view.holder == "b", timeout=5, what="a sees b")
        assert a.view.role is LeaderRole.STANDBY and refused == ["a"]
        await b.stop()
        await a.stop()
