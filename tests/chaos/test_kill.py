"""kill -9 of each Motor program and of each kind of engine, under 16 clients (half streaming).

Each scenario: ``motor up --prefill 2 --decode 2`` (real programs, simulated vLLM engines), load
flowing, one ``SIGKILL``, then the figures of :mod:`tests.chaos.scenario` asserted: failed requests
(0 where a redundant path exists; exceptions written next to the scenario), time until fully ready
again, no instance healthy throughout lost from a coordinator, no process left after the fleet
stopped.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.chaos.fleet import ChaosFleet
from tests.chaos.load import ClosedLoop
from tests.chaos.scenario import assert_figures, run_scenario
from tests.helpers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


async def _kill_program(fleet: ChaosFleet, name: str) -> None:
    old = fleet.kill(name)
    await wait_for(lambda: fleet.restarted(name, old), timeout=15, what=f"motor up to restart {name}")


async def test_kill_controller(tmp_path: Path) -> None:
    async def inject(fleet: ChaosFleet, load: ClosedLoop) -> None:
        await _kill_program(fleet, "controller")

    figs = await run_scenario(tmp_path, "kill-controller", "`kill -9` the controller (motor up restarts it)", inject)
    assert_figures(figs)


async def test_kill_prefill_engine(tmp_path: Path) -> None:
    async def inject(fleet: ChaosFleet, load: ClosedLoop) -> None:
        fleet.signal_engine("prefill-1", signal.SIGKILL)

    figs = await run_scenario(tmp_path, "kill-prefill-engine", "`kill -9` a prefill engine (relaunched)",
                              inject, faulted=("prefill-1",))
    assert_figures(figs)
