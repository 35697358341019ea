"""``ha.unsynced_campaign_delay_sec``: a coordinator the controller has not synced yet (just started
or restarted) leaves a free master lock to a synced peer; it campaigns as soon as it is synced, or
once the delay has passed. Real etcd, real coordinators (in process), instance sets sent over gRPC.

Why: a restarted master racing its synced standby for the lock would win half the time and answer
every request REGISTRY_NOT_SYNCED until the controller's next sync (a chaos run saw 211 failed
requests in 3.3 s)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest

from motor_common.domain import Role
from motor_common.grpc_server import ServerConfig
from motor_common.leadership import LeaderRole
from motor_coordinator.app import Coordinator
from motor_coordinator.config import CoordinatorConfig, DispatchConfig, HaConfig
from motor_coordinator.election import EtcdLeadership
from tests.coordinator.factories import inst
from tests.coordinator.grpc_util import KEY, Stubs
from tests.etcd_server import etcd_server
from tests.helpers import wait_for

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

ELECTION_KEY = "/motor/unsynced-test/leader"


@asynccontextmanager
async def coordinator(etcd: str, delay: float) -> AsyncIterator[tuple[Coordinator, Stubs]]:
    cfg = CoordinatorConfig(
        server=ServerConfig(port=0), master_lock_ttl=2, master_standby_check_interval=0.1,
        dispatch=DispatchConfig(health_probe_interval_sec=0, metrics_scrape_interval_sec=0),
        ha=HaConfig(etcd_endpoints=(etcd,), election_key=ELECTION_KEY, unsynced_campaign_delay_sec=delay))
    app = Coordinator(cfg, management_key=KEY)
    port = await app.start()
    stubs = Stubs(f"127.0.0.1:{port}")
    try:
        yield app, stubs
    finally:
        await stubs.close()
        await app.stop(0)


def _held_back(app: Coordinator) -> bool:
    lead = app.leadership
    return isinstance(lead, EtcdLeadership) and bool(lead.holding_back)


async def test_an_unsynced_coordinator_leaves_the_lock_to_a_synced_one_and_campaigns_once_synced() -> None:
    async with etcd_server() as etcd, AsyncExitStack() as st:
        a, a_stubs = await st.enter_async_context(coordinator(etcd.endpoint, delay=60))
        await wait_for(lambda: _held_back(a), timeout=10, what="a holding back from the free lock")
        assert a.leadership.role is not LeaderRole.MASTER
        b, b_stubs = await st.enter_async_context(coordinator(etcd.endpoint, delay=60))
        await b_stubs.set(inst(1, Role.UNION))  # b is synced: it campaigns
        await wait_for(lambda: b.leadership.role is LeaderRole.MASTER, timeout=10, what="b master")
        await a_stubs.set(inst(1, Role.UNION))
        assert a.leadership.role is LeaderRole.STANDBY  # b holds the lock
        await b.leadership.stop()  # b resigns: a, synced now (its delay is 60 s), takes over at once
        await wait_for(lambda: a.leadership.role is LeaderRole.MASTER, timeout=5, what="a master")


async def test_an_unsynced_coordinator_takes_the_lock_after_the_delay_if_nobody_synced_did() -> None:
    async with etcd_server() as etcd, AsyncExitStack() as st:
        a, _ = await st.enter_async_context(coordinator(etcd.endpoint, delay=1.0))
        await wait_for(lambda: _held_back(a), timeout=10, what="a holding back from the free lock")
        await wait_for(lambda: a.leadership.role is LeaderRole.MASTER, timeout=10, what="a master after the delay")
