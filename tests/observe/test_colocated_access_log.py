"""The coordinator's co-located OpenAI front writes the same access-log line as the gateway, and
its /metrics carries the coordinator's own state."""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp
import pytest

from tests.helpers import wait_for
from tests.procs import start_coordinator

pytestmark = pytest.mark.slow


async def test_colocated_front_logs_each_request(tmp_path: Path) -> None:
    async with start_coordinator(tmp_path, {"http": {"port": 0}}) as c, aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{c.ports['http']}/v1/completions"
        async with http.post(url, json={"model": "tiny", "prompt": "x", "max_tokens": 2},
                             headers={"X-Request-Id": "colo-1"}) as r:
            status = r.status  # no engine registered yet: refused, and still logged
        assert status >= 400

        def line() -> str | None:
            found = [ln for ln in c.log().splitlines() if " motor.access: request " in ln and "request_id=colo-1" in ln]
            return found[0] if found else None

        got = await wait_for(line, timeout=10, what="the access-log line of colo-1")
        fields = dict(re.findall(r" (\w+)=(\S+)", got))
        assert fields["route"] == "/v1/completions" and fields["method"] == "POST"
        assert fields["status"] == str(status) and fields["model"] == "tiny" and fields["stream"] == "False"
        assert float(fields["latency_ms"]) > 0


async def test_colocated_front_metrics_carry_the_coordinator_state_without_an_ops_port(tmp_path: Path) -> None:
    """With no ``server.metrics_port`` the front's /metrics is the only one: the registry, election
    and KV-index gauges must be there too, not only the request metrics."""
    async with start_coordinator(tmp_path, {"http": {"port": 0}}) as c, aiohttp.ClientSession() as http:
        assert c.ports.get("metrics") is None
        async with http.get(f"http://127.0.0.1:{c.ports['http']}/metrics") as r:
            assert r.status == 200
            text = await r.text()
        for name in ("motor_coordinator_registry_generation", "motor_coordinator_registry_instances",
                     "motor_coordinator_election_role", "motor_coordinator_isolated"):
            assert re.search(rf"^{name}(\{{[^}}]*\}})? ", text, re.M), name


async def test_a_client_cannot_forge_log_lines_or_fields_through_the_model_name_in_the_text_log(
    tmp_path: Path,
) -> None:
    """``model`` is the client's: in the text format its newline and escape bytes are escaped and a
    value with spaces or ``=`` is quoted, so the line stays one record with the real fields."""
    forged = "2026-01-01 00:00:00,000 CRITICAL coordinator motor.audit: forged"
    model = f"tiny\n{forged}\x1b[2J status=200 route=/admin"
    async with start_coordinator(tmp_path, {"http": {"port": 0}}) as c, aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{c.ports['http']}/v1/completions"
        async with http.post(url, json={"model": model, "prompt": "x", "max_tokens": 2},
                             headers={"X-Request-Id": "forge-1"}) as r:
            status = r.status
        assert status >= 400

        def line() -> str | None:  # the only request: the only access-log line
            found = [ln for ln in c.log().splitlines() if " motor.access: request " in ln]
            return found[0] if found else None

        got = await wait_for(line, timeout=10, what="the access-log line of forge-1")
        assert got.endswith(" request_id=forge-1"), got  # the whole record on its own line
        assert not any(ln.startswith(forged[:10]) for ln in c.log().splitlines()), "a forged line"
        assert "\x1b" not in c.log()
        fields = dict(re.findall(r' (\w+)=("(?:[^"\\]|\\.)*"|\S+)', got))
        assert fields["status"] == str(status) and fields["route"] == "/v1/completions"
        assert fields["model"] == '"tiny\\n' + forged + '\\x1b[2J status=200 route=/admin"'
