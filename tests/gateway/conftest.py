from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from motor_gateway.config import GatewayConfig
from tests.gateway.fakes import FakeDispatch, fake_coordinator, running_gateway


@dataclass
class Rig:
    url: str
    fake: FakeDispatch
    http: aiohttp.ClientSession


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with fake_coordinator() as (addr, fake):
        cfg = GatewayConfig(coordinators=(addr,), request_timeout_sec=5.0)
        async with running_gateway(cfg, tmp_path) as url, aiohttp.ClientSession() as http:
            yield Rig(url, fake, http)
