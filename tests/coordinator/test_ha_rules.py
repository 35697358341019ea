"""The coordinator's serve/refuse rule and readiness under HA, and the promotion announcement
(pure or in-memory fakes: no sockets)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from motor_common.gen.motor.controller.v1 import controller_pb2 as ctl
from motor_common.leadership import LeaderRole
from motor_coordinator.config import CoordinatorConfig, HaConfig
from motor_coordinator.promotion import PromotionAnnouncer
from motor_coordinator.readiness import ISOLATED, NOT_MASTER, admission, evaluate
from tests.helpers import wait_for


def test_a_standby_refuses_dispatch_with_not_master() -> None:
    err = admission(LeaderRole.STANDBY, isolated=False, degraded_hint=True)
    assert err is not None and err.reason == "NOT_MASTER" and err.message == NOT_MASTER
    assert err.code == "UNAVAILABLE"


def test_an_isolated_master_refuses_unless_the_gateway_routes_in_degraded_mode() -> None:
    err = admission(LeaderRole.MASTER, isolated=True, degraded_hint=False)
    assert err is not None and err.reason == "ISOLATED" and err.code == "UNAVAILABLE"
    assert admission(LeaderRole.MASTER, isolated=True, degraded_hint=True) is None


def test_a_master_and_a_standalone_serve() -> None:
    assert admission(LeaderRole.MASTER, isolated=False, degraded_hint=False) is None
    assert admission(LeaderRole.STANDALONE, isolated=False, degraded_hint=False) is None


def test_readiness_says_isolated_before_not_master_before_no_route() -> None:
    assert evaluate(is_master=True, isolated=True, schedulable=True).reason == ISOLATED
    assert evaluate(is_master=False, isolated=False, schedulable=True).reason == NOT_MASTER
    assert evaluate(is_master=True, isolated=False, schedulable=True).ready


def test_ha_is_on_when_etcd_endpoints_are_set_and_defaults_allow_a_5s_failover() -> None:
    cfg = CoordinatorConfig()
    assert not cfg.ha.enabled
    assert cfg.master_lock_ttl + cfg.master_standby_check_interval <= 4
    assert HaConfig(etcd_endpoints=("127.0.0.1:2379",)).enabled
    with pytest.raises(ValueError):
        HaConfig(etcd_endpoints=("nohostport",))


class FakeController:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.alarms: list[ctl.Alarm] = []

    async def report(self, alarm: ctl.Alarm) -> bool:
        self.alarms.append(alarm)
        if len(self.alarms) <= self.failures:
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                       grpc.aio.Metadata(), "controller down")
        return True

    async def close(self) -> None:
        return None


async def test_promotion_is_announced_with_the_own_address_and_retried_until_accepted() -> None:
    controller = FakeController(failures=2)
    announcer = PromotionAnnouncer(controller, "127.0.0.1:9100", retry_interval=0.01)
    announcer.promoted(term=3)
    await wait_for(lambda: announcer.accepted_terms == [3], timeout=5, what="accepted")
    assert len(controller.alarms) == 3
    alarm = controller.alarms[-1]
    assert alarm.kind == ctl.ALARM_KIND_COORDINATOR_PROMOTED and alarm.action == ctl.ALARM_ACTION_RAISE
    assert alarm.address == "127.0.0.1:9100" and alarm.source == "coordinator@127.0.0.1:9100"
    await announcer.close()


async def test_a_demotion_cancels_a_pending_announcement() -> None:
    controller = FakeController(failures=10**6)
    announcer = PromotionAnnouncer(controller, "127.0.0.1:9100", retry_interval=0.01)
    announcer.promoted(term=1)
    await wait_for(lambda: len(controller.alarms) >= 2, timeout=5, what="retries")
    pending = announcer._pending
    assert pending is not None
    announcer.cancel()
    # the announcing task ends cancelled (no sleep to "see nothing more happen": a task that is
    # done sends nothing more)
    await asyncio.wait([pending], timeout=5)
    assert pending.cancelled() and announcer.accepted_terms == []
    await announcer.close()
