"""`motor up --ha` supervises its etcd like its other programs, and `motor status` shows the
controller's isolation while etcd is gone.

Real processes: `motor up --ha` (etcd, two coordinators, controller on the etcd store, gateway,
nodemanagers with `motor-sim`), the real `motor status` CLI, requests through the `openai` SDK.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import openai
import psutil
import pytest

from tests.conftest import tool
from tests.helpers import wait_for
from tests.motor_up import motor_up

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.timeout(150)]


def status(state: Path) -> dict[str, object]:
    out = subprocess.run([tool("motor"), "status", "--state-dir", str(state), "--json"],
                         capture_output=True, text=True, timeout=30, check=True)
    return dict(json.loads(out.stdout))


async def test_kill_9_etcd_is_restarted_and_status_shows_the_isolation_meanwhile(tmp_path: Path) -> None:
    async with motor_up(tmp_path, "--ha", "--zero-latency", "--restart-delay", "20", timeout=90) as fleet:
        etcd = fleet.info["programs"]["etcd"]
        assert etcd["kind"] == "etcd" and etcd["starts"] == 1
        assert status(fleet.state)["controller"] == {"acting": True, "store_unavailable": "", "isolation": ""}
        os.kill(etcd["pid"], signal.SIGKILL)

        def isolated() -> bool:  # both views while etcd is down (it is restarted after 20 s)
            ctl = status(fleet.state)["controller"]
            assert isinstance(ctl, dict)
            text = subprocess.run([tool("motor"), "status", "--state-dir", str(fleet.state)],
                                  capture_output=True, text=True, timeout=30, check=True).stdout
            return (not ctl["acting"] and bool(ctl["store_unavailable"]) and "ISOLATED" in ctl["isolation"]
                    and "controller ISOLATED: store unavailable" in text and "last known" in text)

        await wait_for(isolated, timeout=18, what="motor status shows the controller isolated")

        def etcd_back() -> bool:
            e = fleet.info["programs"]["etcd"]
            return e["starts"] == 2 and bool(e["pid"]) and psutil.pid_exists(e["pid"])

        await wait_for(etcd_back, timeout=30, what="etcd restarted by motor up")

        def acting_again() -> bool:
            s = status(fleet.state)
            ctl, insts = s["controller"], s["instances"]
            assert isinstance(ctl, dict) and isinstance(insts, list)
            return bool(ctl["acting"]) and not ctl["isolation"] and [i["state"] for i in insts] == ["active"] * 2

        await wait_for(acting_again, timeout=40, what="controller acting again, every instance active")
        client = openai.AsyncOpenAI(base_url=fleet.info["gateway_url"] + "/v1", api_key="unused", max_retries=0,
                                    timeout=10)
        try:
            resp = await client.completions.create(model="tiny", prompt="still there?", max_tokens=4)
            assert resp.choices[0].text
        finally:
            await client.close()
