"""Shared fixtures and helpers for Motor's tests."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """Path of a console tool installed next to this interpreter (the venv), else on PATH."""
    local = BIN / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed: run scripts/setup")
    return found


# --- scheduling under pytest-xdist (scripts/test: -n 2 --dist loadfile) ---------------------------
# The real-vLLM lane as one unit, last. Each of its files starts real vLLM processes (a busy CPU
# worker each, up to two per file). With one unit per file, xdist sent its few-test files last and
# side by side (units go largest first): three vLLMs and their fleets on 2 cores, load average
# 70-80, a fleet not ready after 480 s; in CI a PD test beside another vLLM file, its decode judged
# dead. As one unit the lane's files run one after another on one worker. Last, so that the
# timing-sensitive rest of the suite (chaos, HA, process start-ups) never shares the box with a
# vLLM for long: sent first, a coordinator beside the lane had not started 30 s after its spawn.
REAL_ENGINE_LANE = "tests/realengine"


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: unknown when it is not loaded (-p no:xdist)
def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LaneLastFileScheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(REAL_ENGINE_LANE + "/"):
                return REAL_ENGINE_LANE
            return str(super()._split_scope(nodeid))

        def _assign_work_unit(self, node: Any) -> None:
            if REAL_ENGINE_LANE in self.workqueue:
                self.workqueue.move_to_end(REAL_ENGINE_LANE)
            super()._assign_work_unit(node)

    return LaneLastFileScheduling(config, log)
