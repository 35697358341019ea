"""`motor up --co-located --front-workers 2`: the coordinator serves the OpenAI front as two worker
processes on the fleet's one port (``http.workers``, docs/coordinator.md "Front workers"); the real
`openai` SDK gets its answers, `/metrics` counts the running workers, `motor status` names them and
`motor down` leaves no process behind. What does not combine is refused before anything starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest

from tests.cli.test_first_hour import run
from tests.cli.test_up_co_located import _get, _metric, _reached, _status
from tests.helpers import wait_for
from tests.motor_up import all_gone, motor_down, motor_up


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_co_located_front_workers_serve_the_openai_sdk(tmp_path: Path) -> None:
    async with motor_up(tmp_path, "--co-located", "--front-workers", "2", "--zero-latency", timeout=150) as up:
        info = up.info
        url = info["gateway_url"]
        assert info["topology"]["name"] == "co-located" and info["topology"]["workers"] == 2
        programs = psutil.Process(up.proc.pid).children()
        assert not any("motor-gateway" in " ".join(p.cmdline()) for p in programs)
        (coordinator,) = [p for p in programs if p.pid == info["programs"]["coordinator"]["pid"]]
        workers = [w for w in coordinator.children() if "motor_coordinator.front_worker" in " ".join(w.cmdline())]
        assert len(workers) == 2, [w.cmdline() for w in coordinator.children()]
        said = up.log.read_text()
        assert f"(OpenAI front on {url.rsplit(':', 1)[1]}, 2 worker processes)" in said, said

        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=20) as client:
            for i in range(4):
                resp = await client.completions.create(model="tiny", prompt=f"hello {i}", max_tokens=4)
                assert resp.choices[0].text and resp.usage is not None and resp.usage.completion_tokens == 4

        async def running() -> float:
            status, text = await _get(url + "/metrics")
            assert status == 200, text
            return _metric(text, 'motor_coordinator_front_workers{state="running"}')

        await wait_for(lambda: _reached(running(), 2.0), timeout=10, what="the front reports 2 running workers")
        assert await running() == 2

        view = json.loads(_status(up.state, "--json").stdout)
        assert view["topology"]["workers"] == 2
        assert f"OpenAI front {url}/v1 (2 worker processes)" in _status(up.state).stdout

        pids = motor_down(up)
    assert "Stopped; no process left running." in up.log.read_text()

    await all_gone(pids, "every program of the fleet, and both front workers, gone")


REFUSED: list[tuple[list[str], dict[str, Any] | None, str]] = [
    (["--front-workers", "2"], None,
     "error: --front-workers 2 needs --co-located: it runs the coordinator's own OpenAI front as worker processes; "
     "with the gateway (the default topology) use --gateway-workers 2 for more front processes, or add --co-located"),
    (["--co-located", "--front-workers", "65"], None, "error: --front-workers must be in [1, 64], got 65"),
    (["--co-located", "--front-workers", "2"], {"coordinator": {"http": {"workers": 3}}},
     "error: coordinator.http.workers is set twice: 3 in the fleet config and --front-workers 2; keep one of them"),
]


@pytest.mark.parametrize(("flags", "config", "message"), REFUSED, ids=["without-co-located", "range", "config-too"])
def test_front_workers_refusals_exit_2_and_start_nothing(
        flags: list[str], config: dict[str, Any] | None, message: str, tmp_path: Path) -> None:
    argv = ["motor", "up", *flags]
    if config is not None:
        (tmp_path / "fleet.yaml").write_text(json.dumps(config))
        argv += ["--config", str(tmp_path / "fleet.yaml")]
    done = run(argv, tmp_path)  # asserts that no process was left behind
    assert (done.returncode, done.stderr.strip(), done.stdout) == (2, message, "")
    assert not (tmp_path / ".motor").exists()
