"""kill -9 of each Motor program and of each kind of engine, under 16 clients (half streaming).

Each scenario: ``motor up --prefill 2 --decode 2`` (real programs, simulated vLLM engines), load
flowing, one ``SIGKILL``, then the figures of :mod:`tests.chaos.scenario` asserted: failed requests
(0 where a redundant path exists; exceptions written next to the scenario), time until fully ready
again, no instance healthy throughout lost from a coordinator, no process left after the fleet
stopped.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from pathlib import Path

import pytest

from tests.chaos.fleet import ChaosFleet
from tests.chaos.load import ClosedLoop
from tests.chaos.scenario import CLIENTS, assert_figures, run_scenario
from tests.helpers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


async def _at_least(count: Awaitable[int], n: int) -> bool:
    return await count >= n


async def _kill_program(fleet: ChaosFleet, name: str) -> float:
    """SIGKILL *name*, wait until `motor up` restarted it; returns when it was killed (recovery is
    counted from then)."""
    at = time.monotonic()
    old = fleet.kill(name)
    await wait_for(lambda: fleet.restarted(name, old), timeout=15, what=f"motor up to restart {name}")
    return at


async def test_kill_controller(tmp_path: Path) -> None:
    async def inject(fleet: ChaosFleet, load: ClosedLoop) -> float:
        return await _kill_program(fleet, "controller")

    figs = await run_scenario(tmp_path, "kill-controller", "`kill -9` the controller (motor up restarts it)", inject)
    assert_figures(figs)


async def test_kill_prefill_engine(tmp_path: Path) -> None:
    async def inject(fleet: ChaosFleet, load: ClosedLoop) -> float:
        return await fleet.kill_engine("prefill-1")

    figs = await run_scenario(tmp_path, "kill-prefill-engine", "`kill -9` a prefill engine (relaunched)",
                              inject, faulted=("prefill-1",))
    assert_figures(figs)


async def test_kill_the_only_prefill_engine(tmp_path: Path) -> None:
    """One prefill, two decodes: while the prefill is relaunched no prefill is schedulable, and the
    vLLM decodes compute the requests whole (scheduler.decode_only_fallback) instead of failing
    them (with the fallback off this scenario fails: its requests get 503 until the prefill is back)."""
    async def inject(fleet: ChaosFleet, load: ClosedLoop) -> float:
        return await fleet.kill_engine("prefill-0")

    figs = await run_scenario(tmp_path, "kill-only-prefill-engine",
                              "`kill -9` the only prefill engine (relaunched; the decodes answer alone meanwhile)",
                              inject, prefill=1, faulted=("prefill-0",))  # fmt: skip
    assert_figures(figs)


async def test_kill_the_only_decode_engine(tmp_path: Path) -> None:
    """Two prefills, one decode: while the decode is relaunched no decode is schedulable, and the
    vLLM prefills compute the requests whole (scheduler.prefill_only_fallback) instead of failing
    them; the requests the decode was serving when it died are sent whole to a prefill too (a
    plain answer had sent nothing yet; a stream is continued there)."""
    async def inject(fleet: ChaosFleet, load: ClosedLoop) -> float:
        return await fleet.kill_engine("decode-0")

    figs = await run_scenario(tmp_path, "kill-only-decode-engine",
                              "`kill -9` the only decode engine (relaunched; the prefills answer alone meanwhile)",
                              inject, decode=1, faulted=("decode-0",))  # fmt: skip
    assert_figures(figs)


async def test_kill_nodemanager(tmp_path: Path) -> None:
    async def inject(fleet: ChaosFleet, load: ClosedLoop) -> float:
        return await _kill_program(fleet, "prefill-1")

    figs = await run_scenario(
        tmp_path, "kill-nodemanager",
        "`kill -9` a prefill node's nodemanager (its engine outlives it and serves on; motor up restarts the node, which adopts it)",
        inject, faulted=("prefill-1",))  # fmt: skip
    assert_figures(figs)


async def test_kill_decode_engine_mid_stream(tmp_path: Path) -> None:
    async def inject(fleet: ChaosFleet, load: ClosedLoop) -> float:
        # mid-stream for sure: 6 long streams (≈ 5 s each) spread over both decodes by the
        # scheduler, and the engine decoding at least 4 requests when it dies. (Plain requests on
        # a dying decode are re-sent before their head; only streams are really mid-way.)
        load.long_streams(6, max_tokens=800)
        await wait_for(lambda: _at_least(fleet.running_requests("decode-1"), 4), timeout=10, interval=0.01,
                       what="decode-1 decoding at least 4 requests")
        return await fleet.kill_engine("decode-1")

    figs = await run_scenario(
        tmp_path, "kill-decode-engine-mid-stream",
        "`kill -9` a decode engine while it streams (mid-stream migration to the other decode)",
        inject, faulted=("decode-1",), max_tokens=64)  # fmt: skip
    assert_figures(figs)


async def test_kill_gateway_one_of_two(tmp_path: Path) -> None:
    """Two gateways; each client starts on one and sends a request to the other when its gateway
    cannot be reached before the status line (tests/chaos/load.py). A stream that had started on
    the killed gateway loses its TCP connection: nothing can resume it, so those are accepted."""
    killed_at: list[float] = []

    async def inject(fleet: ChaosFleet, load: ClosedLoop) -> float:
        killed_at.append(time.monotonic())
        return await _kill_program(fleet, "gateway")

    def check(load: ClosedLoop) -> list[str]:
        gw = load.urls[0]
        wrong = [o.describe() for o in load.failures()
                 if not (o.stream and o.status == 200 and o.gateway == gw and o.start < killed_at[0])]
        return [f"{len(wrong)} failures other than streams cut on the killed gateway, e.g. {wrong[:2]}"] if wrong else []

    figs = await run_scenario(
        tmp_path, "kill-gateway-of-two", "`kill -9` one of two gateways (clients fall back to the other)",
        inject, gateways=2, max_failed=CLIENTS // 2, check=check,
        exception="streams that were running through the killed gateway are cut with its TCP "
                  "connections (at most one per streaming client); every other request is "
                  "answered by the other gateway")  # fmt: skip
    assert_figures(figs)


async def test_kill_coordinator_without_ha(tmp_path: Path) -> None:
    """One coordinator: while it restarts nothing can dispatch. Clients must get 503 with
    Retry-After (never 404, never a hang); streams it was relaying are cut."""
    killed_at: list[float] = []

    async def inject(fleet: ChaosFleet, load: ClosedLoop) -> float:
        killed_at.append(time.monotonic())
        return await _kill_program(fleet, "coordinator")

    def check(load: ClosedLoop) -> list[str]:
        wrong = [o.describe() for o in load.failures()
                 if not (o.status == 503 and o.retry_after)
                 and not (o.stream and o.status == 200 and o.start < killed_at[0])]
        return [f"{len(wrong)} failures other than 503 + Retry-After or cut streams, e.g. {wrong[:2]}"] if wrong else []

    figs = await run_scenario(
        tmp_path, "kill-coordinator", "`kill -9` the only coordinator (no HA; motor up restarts it)",
        inject, max_failed=100_000, check=check, recovery_bound=20,
        exception="without HA there is one coordinator: until it is back and has the controller's "
                  "instance set, the gateway answers 503 with Retry-After (clients retry); streams "
                  "it was relaying are cut")  # fmt: skip
    assert_figures(figs)


async def test_kill_master_coordinator_ha(tmp_path: Path) -> None:
    """`--ha`: the standby takes over; requests not yet answered are re-sent to it by the gateway.
    A request the killed master had begun to answer dies with it (accepted, like the gateway's)."""
    killed_at: list[float] = []

    async def inject(fleet: ChaosFleet, load: ClosedLoop) -> float:
        master = await wait_for(fleet.master, timeout=10, what="a ready master coordinator")
        killed_at.append(time.monotonic())
        return await _kill_program(fleet, fleet.coordinator_name(master))

    def check(load: ClosedLoop) -> list[str]:
        wrong = [o.describe() for o in load.failures() if not o.start < killed_at[0]]
        return [f"{len(wrong)} failures of requests sent after the kill, e.g. {wrong[:2]}"] if wrong else []

    figs = await run_scenario(
        tmp_path, "kill-coordinator-ha", "`kill -9` the master coordinator (`--ha`: the standby takes over)",
        inject, args=("--ha",), max_failed=CLIENTS, check=check,
        exception="requests the killed master had begun to answer die with it (at most one per "
                  "client; streams cannot be resumed; a plain one could be re-sent by the gateway, "
                  "which it does not do yet); every other request is served by the new master")  # fmt: skip
    assert_figures(figs)
