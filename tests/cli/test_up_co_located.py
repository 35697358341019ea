"""`motor up --co-located`: the fleet without a gateway process, the coordinator serving the
OpenAI front itself on the port the gateway would have used (motor_cli.topology).

Real processes: `motor up` starts coordinator, controller and two nodemanagers (which launch
`motor-sim` engines); the real `openai` SDK talks to the coordinator's front; `motor status` and
`motor down` are the installed CLI. What does not combine is refused before anything starts.
"""

from __future__ import annotations

import json
import ssl
import subprocess
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import openai
import psutil
import pytest

from tests.cli.test_first_hour import run
from tests.conftest import tool
from tests.helpers import wait_for
from tests.motor_up import UpFleet, all_gone, motor_down, motor_up

T = TypeVar("T")


def _programs(up: UpFleet) -> list[str]:
    return sorted(" ".join(p.cmdline()) for p in psutil.Process(up.proc.pid).children())


async def _get(url: str, ca: str | None = None) -> tuple[int, str]:
    ctx: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca) if ca else True
    async with aiohttp.ClientSession() as s, s.get(url, ssl=ctx, timeout=aiohttp.ClientTimeout(total=10)) as r:
        return r.status, await r.text()


async def _sim_finished(endpoint: str) -> int:
    status, text = await _get(f"http://{endpoint}/sim/state")
    assert status == 200, text
    return int(json.loads(text)["stats"]["requests_finished"])


def _metric(text: str, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


async def _reached(value: Awaitable[T], want: T) -> bool:
    return await value == want


def _status(state: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("motor"), "status", "--state-dir", str(state), *more],
                          capture_output=True, text=True, timeout=30, check=True)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_co_located_fleet_serves_the_openai_sdk_without_a_gateway(tmp_path: Path) -> None:
    async with motor_up(tmp_path, "--co-located", "--zero-latency", timeout=150) as up:
        info = up.info
        url = info["gateway_url"]
        port = int(url.rsplit(":", 1)[1])
        # No gateway process, no gateway program, no gateway key; the coordinator holds the port.
        programs = _programs(up)
        assert not any("motor-gateway" in p for p in programs), programs
        assert sorted(info["programs"]) == ["controller", "coordinator", "decode-0", "prefill-0"]
        assert "gateway" not in info["keys"]
        assert info["topology"]["name"] == "co-located" and info["topology"]["front"] == "coordinator"
        coordinator_ports = json.loads((up.state / "coordinator.ports.json").read_text())
        assert coordinator_ports["http"] == port
        said = up.log.read_text()
        assert f"OpenAI front {url}/v1  (served by the coordinator; no gateway)" in said, said
        assert f"port {info['programs']['coordinator']['port']} (OpenAI front on {port})" in said, said
        assert "gateway ready" not in said and "started gateway" not in said, said

        view = json.loads(_status(up.state, "--json").stdout)
        assert view["topology"] == {"name": "co-located", "front": "coordinator", "url": url, "workers": 1,
                                    "description": info["topology"]["description"]}
        engines: dict[str, str] = {i["role"]: i["endpoints"][0] for i in view["instances"] if i["state"] == "active"}
        assert sorted(engines) == ["decode", "prefill"]
        text = _status(up.state).stdout
        assert f"topology: co-located: the coordinator serves the OpenAI front itself (no gateway process); " \
               f"OpenAI front {url}/v1" in text, text
        assert "gateway" not in text.split("PROGRAM", 1)[1], text

        before = {role: await _sim_finished(ep) for role, ep in engines.items()}
        _, metrics = await _get(url + "/metrics")
        served = 'motor_gateway_requests_total{route="/v1/chat/completions",status="200"}'
        counted = _metric(metrics, served)
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=20) as client:
            chat = await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Hello, Motor"}], max_tokens=6)
            assert chat.choices[0].message.content and chat.usage is not None
            assert chat.usage.completion_tokens == 6
            stream = await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=5, stream=True)
            chunks = [c async for c in stream]
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert chunks[-1].choices == [] or chunks[-1].choices[0].finish_reason == "length"
        # PD: each request went through the prefill engine, then the decode engine (an engine counts
        # a request when its generator ends, which may be just after the client's last byte).
        async def finished() -> dict[str, int]:
            return {role: await _sim_finished(ep) for role, ep in engines.items()}

        want = {role: n + 2 for role, n in before.items()}
        await wait_for(lambda: _reached(finished(), want), timeout=10, what="both engines count both requests")
        assert await finished() == want

        health, ready = await _get(url + "/health"), await _get(url + "/ready")
        assert health[0] == 200 and ready[0] == 200, (health, ready)
        # The front counts a request once its handler returns (just after the last byte).
        async def scraped() -> float:
            status, metrics = await _get(url + "/metrics")
            assert status == 200, metrics
            return _metric(metrics, served)

        await wait_for(lambda: _reached(scraped(), counted + 2), timeout=10, what="the front counts both requests")
        assert await scraped() == counted + 2
        _, metrics = await _get(url + "/metrics")
        assert "motor_coordinator_" in metrics  # the coordinator's own state on the same scrape

        pids = motor_down(up)
    assert "Stopped; no process left running." in up.log.read_text()

    await all_gone(pids, "every program of the fleet gone")
    assert not (up.state / "fleet.json").exists()


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_co_located_front_serves_https_under_tls(tmp_path: Path) -> None:
    async with motor_up(tmp_path, "--co-located", "--tls", "--zero-latency", timeout=150) as up:
        info = up.info
        url = info["gateway_url"]
        assert url.startswith("https://") and not any("motor-gateway" in p for p in _programs(up))
        ca = info["tls"]["ca_file"]
        async with openai.DefaultAsyncHttpxClient(verify=ssl.create_default_context(cafile=ca)) as http:
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=20,
                                        http_client=http)
            chat = await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "over TLS"}], max_tokens=4)
            assert chat.usage is not None and chat.usage.completion_tokens == 4
        assert (await _get(url + "/ready", ca))[0] == 200
        # Without the fleet CA the SDK refuses the coordinator's certificate.
        untrusting = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=10)
        with pytest.raises(openai.APIConnectionError):
            await untrusting.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])


REFUSED: list[tuple[list[str], dict[str, Any] | None, str]] = [
    (["--ha"], None,
     "error: --co-located and --ha do not combine: with two coordinators only the gateway fails over between "
     "them (a co-located front lives and dies with its one coordinator); run `motor up --ha` for active/standby, "
     "or `motor up --co-located` without --ha"),
    (["--gateway-workers", "2"], None,
     "error: --co-located and --gateway-workers 2 do not combine: there is no gateway process (the coordinator "
     "serves the OpenAI front); use --front-workers 2 to run the co-located front as 2 worker processes, or drop "
     "--co-located to run gateway workers"),
    ([], {"gateway": {"workers": 2}},
     "error: the fleet config's `gateway` section does nothing with --co-located (no gateway runs); put the "
     "front's settings under `coordinator: {http: {...}}` (limits, admission, api_key_file: docs/coordinator.md), "
     "or drop --co-located"),
    ([], {"coordinator": {"http": {"port": 9999}}},
     "error: coordinator.http.port is set by `motor up --co-located` (from --port); remove it from the fleet "
     "config and pass --port instead"),
]


@pytest.mark.parametrize(("flags", "config", "message"), REFUSED, ids=["ha", "gateway-workers", "gateway-section",
                                                                       "http-port"])
@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
def test_what_does_not_combine_is_refused_with_exit_2_and_starts_nothing(
        flags: list[str], config: dict[str, Any] | None, message: str, dry_run: bool, tmp_path: Path) -> None:
    argv = ["motor", "up", "--co-located", *flags, *(["--dry-run"] if dry_run else [])]
    if config is not None:
        (tmp_path / "fleet.yaml").write_text(json.dumps(config))
        argv += ["--config", str(tmp_path / "fleet.yaml")]
    done = run(argv, tmp_path)  # asserts that no process was left behind
    assert (done.returncode, done.stderr.strip(), done.stdout) == (2, message, "")
    assert not (tmp_path / ".motor").exists()


def test_dry_run_shows_the_topology_and_the_coordinator_accepts_its_front(tmp_path: Path) -> None:
    done = run(["motor", "up", "--co-located", "--tls", "--port", "0", "--dry-run"], tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("# topology: co-located: the coordinator serves the OpenAI front itself "
                          "(no gateway process)\n"), out[:300]
    assert "# gateway:" not in out and "motor-gateway" not in out
    assert "require_client_cert: false" in out.split("# controller:")[0].split("\nhttp:\n", 1)[1]
    assert "# every program accepted its configuration (4 checked with --check-config)" in out
