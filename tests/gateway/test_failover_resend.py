"""The gateway's pre-head resend with two coordinators (real gRPC fakes, real gateway): a request
refused because the master has not received its instance set yet is not answered 503; it waits
(bounded by ``failover_timeout_sec``) for a ready route and is sent again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from motor_common import errors
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_gateway.config import GatewayConfig
from tests.gateway.fakes import chunk, failing, fake_coordinator, head, replay, running_gateway
from tests.helpers import wait_for

COMPLETION = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
NOT_SYNCED = errors.Unavailable("instance set not received yet", reason="REGISTRY_NOT_SYNCED")


def _cfg(*addrs: str, failover: float = 10.0) -> GatewayConfig:
    return GatewayConfig(coordinators=addrs, request_timeout_sec=15, probe_interval_sec=0.05,
                         failover_timeout_sec=failover)


async def test_a_master_not_synced_yet_hands_the_request_to_a_synced_peer_that_takes_over(tmp_path: Path) -> None:
    async with fake_coordinator() as (a_addr, a), fake_coordinator() as (b_addr, b):
        # a: just elected, instance set not received (a master that routes for its precise error)
        a.role, a.ready, a.reason = cpb.COORDINATOR_ROLE_MASTER, False, "registry not synced"
        a.script = failing(NOT_SYNCED)
        b.role, b.ready, b.reason = cpb.COORDINATOR_ROLE_STANDBY, False, "Coordinator is not master"
        b.script = replay(head(), chunk(b'{"from": "b"}'))
        async with running_gateway(_cfg(a_addr, b_addr), tmp_path) as url, aiohttp.ClientSession() as http:
            post = asyncio.ensure_future(http.post(f"{url}/v1/completions", json=COMPLETION))
            await wait_for(lambda: len(a.requests) >= 1, timeout=10, what="the request refused by a")
            assert not post.done()  # held, not answered 503
            # b takes over (a synced standby wins the lock), a steps down
            a.role, a.reason = cpb.COORDINATOR_ROLE_STANDBY, "Coordinator is not master"
            b.role, b.ready, b.reason = cpb.COORDINATOR_ROLE_MASTER, True, ""
            resp = await asyncio.wait_for(post, 10)
            async with resp:
                assert resp.status == 200, await resp.text()
                assert await resp.json() == {"from": "b"}
        assert len(b.requests) == 1 and b.requests[0].request_id == a.requests[0].request_id


async def test_a_master_not_synced_yet_serves_the_request_once_its_instance_set_arrives(tmp_path: Path) -> None:
    async with fake_coordinator() as (a_addr, a), fake_coordinator() as (b_addr, b):
        a.role, a.ready, a.reason = cpb.COORDINATOR_ROLE_MASTER, False, "registry not synced"
        a.script = failing(NOT_SYNCED)
        b.role, b.ready = cpb.COORDINATOR_ROLE_STANDBY, False
        async with running_gateway(_cfg(a_addr, b_addr), tmp_path) as url, aiohttp.ClientSession() as http:
            post = asyncio.ensure_future(http.post(f"{url}/v1/completions", json=COMPLETION))
            await wait_for(lambda: len(a.requests) >= 1, timeout=10, what="the request refused by a")
            a.script, a.ready, a.reason = replay(head(), chunk(b'{"from": "a"}')), True, ""  # synced
            resp = await asyncio.wait_for(post, 10)
            async with resp:
                assert resp.status == 200 and await resp.json() == {"from": "a"}
        assert len(a.requests) == 2 and not b.requests


async def test_not_synced_for_longer_than_the_failover_bound_is_503_with_retry_after(tmp_path: Path) -> None:
    async with fake_coordinator() as (a_addr, a), fake_coordinator() as (b_addr, b):
        a.role, a.ready, a.reason = cpb.COORDINATOR_ROLE_MASTER, False, "registry not synced"
        a.script = failing(NOT_SYNCED)
        b.role, b.ready = cpb.COORDINATOR_ROLE_STANDBY, False
        async with running_gateway(_cfg(a_addr, b_addr, failover=0.5), tmp_path) as url, \
                aiohttp.ClientSession() as http:
            async with http.post(f"{url}/v1/completions", json=COMPLETION) as resp:
                assert resp.status == 503 and resp.headers["Retry-After"] == "1"
                body = await resp.json()
        assert body["error"]["code"] == "service_unavailable" and "retry later" in body["error"]["message"]
        assert 1 <= len(a.requests) <= 3 and not b.requests  # bounded resends (dispatch_attempts)
