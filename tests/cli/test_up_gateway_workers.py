"""`motor up --gateway-workers 2`: the gateway runs as a supervisor and two workers on the fleet's
one gateway port; the real `openai` SDK gets its answers, `/metrics` counts
every worker's requests, and `motor up` stops every process it started."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import openai
import psutil
import pytest

from tests.motor_up import UpFleet, motor_up

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _gateway(up: UpFleet) -> psutil.Process:
    (gw,) = [p for p in psutil.Process(up.proc.pid).children(recursive=True)
             if "motor-gateway" in " ".join(p.cmdline()) and p.ppid() == up.proc.pid]
    return gw


async def _metric(url: str, prefix: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


async def test_motor_up_gateway_workers_serve_on_one_port(tmp_path: Path) -> None:
    async with motor_up(tmp_path, "--zero-latency", "--gateway-workers", "2", timeout=150) as up:
        gateway = _gateway(up)
        workers = gateway.children()
        assert len(workers) == 2, [w.cmdline() for w in workers]
        assert all("--worker-index" in w.cmdline() for w in workers)
        url = up.info["gateway_url"]
        assert up.info["topology"]["workers"] == 2  # what `motor status` shows after the topology line
        before = await _metric(url, 'motor_gateway_requests_total{route="/v1/completions",status="200"}')
        for i in range(12):  # a client per request: a new connection each time
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                                          timeout=20) as client:
                resp = await client.completions.create(model="tiny", prompt=f"hello {i}", max_tokens=4)
                assert resp.choices[0].text and resp.usage is not None
        # The count of every worker, whichever one answers the scrape (which worker takes which
        # connection: tests/gateway/test_workers.py).
        assert await _metric(url, 'motor_gateway_requests_total{route="/v1/completions",status="200"}') == before + 12
        assert await _metric(url, 'motor_gateway_workers{state="running"}') == 2
    out = up.log.read_text()
    assert "no process left running" in out, out[-2000:]
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
