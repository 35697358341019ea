"""Engine health probe used before registration: ``GET /v1/models`` must list at least one model."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp
import orjson

from motor_common.domain import Endpoint

# The most of a /v1/models body read: a model list is a few hundred bytes per model; an engine
# sending more (an endless body) is unhealthy, not buffered until the timeout (2 GB in 5 s).
MAX_BODY = 1024 * 1024


@dataclass(frozen=True)
class Probe:
    endpoint: str
    healthy: bool
    detail: str
    models: tuple[str, ...] = ()


async def probe(session: aiohttp.ClientSession, ep: Endpoint, timeout: float) -> Probe:
    url = f"{ep.base_url}/v1/models"
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status != 200:
                return Probe(ep.host_port, False, f"GET /v1/models answered HTTP {resp.status}")
            body = bytearray()
            async for chunk in resp.content.iter_chunked(64 * 1024):
                body += chunk
                if len(body) > MAX_BODY:
                    return Probe(ep.host_port, False, f"GET /v1/models answered more than {MAX_BODY} bytes")
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return Probe(ep.host_port, False, f"GET /v1/models failed: {type(exc).__name__}: {exc}".rstrip(": "))
    try:
        data = orjson.loads(body).get("data")
    except (orjson.JSONDecodeError, AttributeError):
        return Probe(ep.host_port, False, "GET /v1/models did not answer a JSON object")
    if not isinstance(data, list) or not data:
        return Probe(ep.host_port, False, "GET /v1/models answered an empty model list (engine not ready?)")
    models = tuple(str(m.get("id")) for m in data if isinstance(m, dict))
    return Probe(ep.host_port, True, "ok", models)


async def probe_all(endpoints: list[Endpoint], timeout: float = 5.0) -> list[Probe]:
    async with aiohttp.ClientSession() as session:
        return list(await asyncio.gather(*(probe(session, ep, timeout) for ep in endpoints)))
