"""SIGSTOP (10 s, then SIGCONT) of an engine, of the master coordinator and of etcd; the poison
request; a controller restart while an engine is being relaunched — each under 16 clients (half
streaming), each asserting the figures of :mod:`tests.chaos.scenario`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from motor_cli.status import fetch_view
from tests.chaos.fleet import ChaosFleet
from tests.chaos.load import ClosedLoop
from tests.chaos.scenario import assert_figures, run_scenario
from tests.helpers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

FREEZE_SEC = 10.0  # the fault lasts this long: it is the scenario, not a synchronisation
SLOWEST_OK_SEC = 8.0  # a request stalled on a hung engine must be failed over well before this


async def _freeze(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(FREEZE_SEC)
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_freeze_prefill_engine(tmp_path: Path) -> None:
    frozen_at: list[float] = []

    async def inject(fleet: ChaosFleet, load: ClosedLoop) -> None:
        pids = fleet.signal_engine("prefill-1", signal.SIGSTOP)
        frozen_at.append(time.monotonic())
        try:
            await asyncio.sleep(FREEZE_SEC)
        finally:
            for pid in pids:
                if _exists(pid):
                    os.killpg(os.getpgid(pid), signal.SIGCONT)

    def check(load: ClosedLoop) -> list[str]:
        slow = [o for o in load.outcomes if o.end - o.start > SLOWEST_OK_SEC]
        t0 = frozen_at[0] if frozen_at else 0.0
        what = "; ".join(f"{'stream' if o.stream else 'plain'} sent at SIGSTOP{o.start - t0:+.2f} s took "
                         f"{o.end - o.start:.2f} s" for o in slow[:5])
        return [f"{len(slow)} requests took more than {SLOWEST_OK_SEC:g} s (stalled on the frozen engine): "
                f"{what}"] if slow else []

    figs = await run_scenario(
        tmp_path, "freeze-prefill-engine", f"SIGSTOP a prefill engine {FREEZE_SEC:g} s, then SIGCONT",
        # parole (opt-in): the requests the frozen engine was serving are served elsewhere; with the
        # default (strict containment) they are refused as poison suspects (docs/fault-tolerance.md)
        inject, faulted=("prefill-1",), check=check,
        coordinator={"dispatch": {"parole_suspects": True}})  # fmt: skip
    assert_figures(figs)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_freeze_master_coordinator(tmp_path: Path) -> None:
    async def inject(fleet: ChaosFleet, load: ClosedLoop) -> None:
        master = await wait_for(fleet.master, timeout=10, what="a ready master coordinator")
        await _freeze(fleet.pid(fleet.coordinator_name(master)))

    figs = await run_scenario(
        tmp_path, "freeze-master-coordinator",
        f"SIGSTOP the master coordinator {FREEZE_SEC:g} s, then SIGCONT (`--ha`)",
        inject, args=("--ha",))  # fmt: skip
    assert_figures(figs)


async def test_freeze_etcd(tmp_path: Path) -> None:
    async def inject(fleet: ChaosFleet, load: ClosedLoop) -> None:
        await _freeze(fleet.etcd_pid())

    figs = await run_scenario(
        tmp_path, "freeze-etcd", f"SIGSTOP etcd {FREEZE_SEC:g} s, then SIGCONT (`--ha`)",
        inject, args=("--ha",))  # fmt: skip
    assert_figures(figs)


POISON = {"prompt": "p", "max_tokens": 2, "logprobs": 1000}
POISON_TIMEOUT_SEC = 15.0  # vLLM answers it 400 at once


async def test_poison_request(tmp_path: Path) -> None:
    """The request of issue 12 that made a prefill engine busy > 30 s, retried on the other one:
    it must get vLLM's 400, and nothing else may fail or restart."""
    answers: list[tuple[int, bytes]] = []

    async def inject(fleet: ChaosFleet, load: ClosedLoop) -> None:
        async def poison(http: aiohttp.ClientSession) -> None:
            try:
                async with http.post(f"{fleet.gateway_urls[0]}/v1/completions",
                                     data=orjson.dumps({"model": fleet.model, **POISON}),
                                     headers={"Content-Type": "application/json"},
                                     timeout=aiohttp.ClientTimeout(total=POISON_TIMEOUT_SEC)) as r:
                    answers.append((r.status, await r.read()))
            except (TimeoutError, aiohttp.ClientError) as exc:
                answers.append((0, f"{type(exc).__name__} after {POISON_TIMEOUT_SEC:g} s".encode()))

        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(poison(http) for _ in range(3)))

    def check(load: ClosedLoop) -> list[str]:
        bad = [f"{s}: {b[:160]!r}" for s, b in answers if s != 400]
        return [f"poison request not answered 400: {bad}"] if bad else []

    figs = await run_scenario(tmp_path, "poison-request",
                              'the poison request `{"prompt":"p","max_tokens":2,"logprobs":1000}`, 3 at once', inject, check=check)
    assert_figures(figs)


async def test_controller_restart_during_engine_relaunch(tmp_path: Path) -> None:
    async def inject(fleet: ChaosFleet, load: ClosedLoop) -> None:
        fleet.signal_engine("prefill-1", signal.SIGKILL)

        async def recovering() -> bool:
            view = await fetch_view(fleet.up.info["controller"], fleet.key, timeout=1.0)
            return any(i["job"] == "prefill-1" and i["state"] == "recovering" for i in view.instances)

        await wait_for(recovering, timeout=10, interval=0.02, what="prefill-1 RECOVERING (relaunch under way)")
        old = fleet.kill("controller")
        await wait_for(lambda: fleet.restarted("controller", old), timeout=15, what="motor up to restart the controller")

    figs = await run_scenario(
        tmp_path, "controller-restart-during-relaunch",
        "`kill -9` the controller while it relaunches a killed prefill engine",
        inject, faulted=("prefill-1",))  # fmt: skip
    assert_figures(figs)
