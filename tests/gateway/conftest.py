from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from motor_gateway.config import GatewayConfig
from tests.gateway.fakes import FakeDispatch, fake_coordinator, in_process_gateway, running_gateway


@dataclass
class Rig:
    url: str
    fake: FakeDispatch
    http: aiohttp.ClientSession


@pytest.fixture(params=["grpc", "in_process"])
async def rig(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Rig]:
    """The gateway's HTTP app with each DispatchClient: over gRPC to a scripted fake coordinator
    (``motor-gateway``), and in process (the coordinator's co-located front) running the same scripts."""
    if request.param == "in_process":
        async with in_process_gateway() as (url, fake), aiohttp.ClientSession() as http:
            yield Rig(url, fake, http)
        return
    async with fake_coordinator() as (addr, fake):
        cfg = GatewayConfig(coordinators=(addr,), request_timeout_sec=5.0)
        async with running_gateway(cfg, tmp_path) as url, aiohttp.ClientSession() as http:
            yield Rig(url, fake, http)
