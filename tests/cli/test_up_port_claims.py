"""Two `motor up` on one machine: while a program of the first is down for a restart its port is
free, and the second must not pick it — else the restart fails with "port in use" and the first
fleet stops (a CI run lost a fleet that way, with two test workers starting fleets side by side).

Real processes: two `motor up` fleets of simulated engines.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from motor_common.ports import port_free
from tests.helpers import wait_for
from tests.motor_up import motor_up

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


async def test_a_second_motor_up_never_takes_the_port_of_a_program_being_restarted(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    # a restart delay long enough for the second fleet to pick its ports while the controller is down
    async with motor_up(tmp_path / "a", "--prefill", "1", "--decode", "1", "--zero-latency",
                        "--restart-delay", "40") as first:
        program = first.info["programs"]["controller"]
        port, old = program["port"], program["pid"]
        os.kill(old, signal.SIGKILL)
        await wait_for(lambda: port_free("127.0.0.1", port), timeout=10, what="the controller's port free")
        async with motor_up(tmp_path / "b", "--prefill", "1", "--decode", "1", "--zero-latency") as second:
            theirs = {p["port"] for p in second.info["programs"].values()}
            assert port not in theirs, (port, second.info["programs"])
            # the second fleet picked while the controller was down (else this test proved nothing)
            assert first.info["programs"]["controller"]["starts"] == 1, first.info["programs"]["controller"]

        def restarted() -> bool:
            pid = first.info["programs"]["controller"]["pid"]
            return bool(pid) and pid != old and psutil.pid_exists(pid) and not port_free("127.0.0.1", port)

        await wait_for(restarted, timeout=60, what="the first fleet's controller restarted on its port")
        assert first.proc.poll() is None, first.diagnostics()  # the first fleet still runs
        assert "is in use" not in first.log.read_text(), first.diagnostics()
