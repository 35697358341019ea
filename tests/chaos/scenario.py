"""One chaos scenario end to end: fleet up, load on, fault, back to fully ready, fleet down, figures.

:func:`run_scenario` returns the :class:`Figures` the test asserts on; with ``MOTOR_CHAOS_RESULTS``
set to a directory it also writes them there as ``<scenario>.json``, which ``scripts/chaos-table``
renders as the table in docs/fault-tolerance.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.fleet import ChaosFleet, InstanceWatcher, chaos_fleet
from tests.chaos.load import ClosedLoop
from tests.helpers import wait_for

RESULTS_ENV = "MOTOR_CHAOS_RESULTS"
CLIENTS = 16
SCENARIO_BUDGET = 60.0  # seconds of load per scenario, at most


@dataclass
class Figures:
    scenario: str
    fault: str
    fleet: str
    requests: int = 0
    failed: int = 0
    failed_by_status: dict[str, int] = field(default_factory=dict)
    failed_streams_cut: int = 0  # failed streams that had received bytes
    failures: list[str] = field(default_factory=list)  # the first few, as the client saw them
    recovery_s: float | None = None  # end of the fault -> fully ready (None: not within the bound)
    not_ready_reason: str = ""  # what was still missing when the bound passed
    outage_s: float = 0.0  # longest time after the fault began without a successful request
    lost: int = 0
    lost_examples: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    exception: str = ""  # why failures are accepted here (written in docs)
    max_failed: int = 0
    recovery_bound: float = 30.0
    violations: list[str] = field(default_factory=list)  # what the issue demands and this run missed
    extra: dict[str, Any] = field(default_factory=dict)

    def judge(self, more: list[str]) -> None:
        v = []
        if self.orphans:
            v.append(f"{len(self.orphans)} process(es) left after the fleet stopped")
        if self.recovery_s is None or self.recovery_s > self.recovery_bound:
            v.append(f"not fully ready within {self.recovery_bound:g} s ({self.not_ready_reason})")
        if self.lost:
            v.append(f"{self.lost} listings lacked an instance healthy throughout")
        if self.failed > self.max_failed:
            v.append(f"{self.failed} failed requests (at most {self.max_failed})")
        if self.requests < 100:
            v.append(f"only {self.requests} requests: too little load to show anything")
        self.violations = v + more

    def summary(self) -> str:
        return json.dumps(asdict(self), indent=1)

    def write(self) -> None:
        out = os.environ.get(RESULTS_ENV)
        if not out:
            return
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{self.scenario}.json").write_text(json.dumps(asdict(self), indent=1) + "\n")


# Returns when the fault is over; may return the time.monotonic() it ended (see run_scenario).
Inject = Callable[[ChaosFleet, ClosedLoop], Awaitable[Any]]
# Scenario-specific checks on the load after the run: a list of what is wrong (empty: fine).
Check = Callable[[ClosedLoop], list[str]]


async def run_scenario(
    tmp_path: Path,
    scenario: str,
    fault: str,
    inject: Inject,
    *,
    args: tuple[str, ...] = (),
    prefill: int = 2,
    decode: int = 2,
    gateways: int = 1,
    faulted: tuple[str, ...] = (),
    recovery_bound: float = 30.0,
    settle: float = 3.0,
    exception: str = "",
    max_failed: int = 0,
    check: Check | None = None,
    max_tokens: int = 24,
    coordinator: dict[str, Any] | None = None,
) -> Figures:
    """Fleet up (``motor up --prefill P --decode D *args*``), 16 clients (half streaming) until
    they flow, ``inject(fleet, load)`` (returns when the fault is over: at once for a kill, after
    SIGCONT for a freeze), then until the fleet is fully ready (at most *recovery_bound* s) and
    *settle* s more; load off, fleet down, leftover processes checked. *faulted*: the nodes the
    fault touches (every other instance must stay listed and available throughout)."""
    shape = f"motor up --prefill {prefill} --decode {decode}{' ' if args else ''}{' '.join(args)}, fault tolerance on"
    if gateways > 1:
        shape += f" + {gateways - 1} more gateway(s)"
    if coordinator:
        shape += ", coordinator " + ", ".join(f"{k}: {v}" for k, v in coordinator.items())
    figs = Figures(scenario, fault, shape, exception=exception, max_failed=max_failed,
                   recovery_bound=recovery_bound)
    more: list[str] = []
    fleet_ref: list[ChaosFleet] = []
    try:
        async with chaos_fleet(tmp_path, *args, prefill=prefill, decode=decode, gateways=gateways,
                               coordinator=coordinator) as fleet:
            fleet_ref.append(fleet)
            watcher = InstanceWatcher(fleet.coordinators, fleet.key)
            watch = asyncio.get_running_loop().create_task(watcher.run())
            load = ClosedLoop(fleet.gateway_urls, fleet.model, clients=CLIENTS, duration=SCENARIO_BUDGET,
                              max_tokens=max_tokens)
            try:
                load.start()
                await load.wait_completed(2 * CLIENTS)
                t_fault = time.monotonic()
                ended = await inject(fleet, load)
                # a fault that is over at once (a kill) may return when it happened, after waiting
                # until the fleet noticed it (else "fully ready" could be read before anyone noticed)
                t_over = ended if isinstance(ended, float) else time.monotonic()
                try:
                    await wait_for(fleet.fully_ready, timeout=recovery_bound, interval=0.1,
                                   what="fully ready after the fault")
                    figs.recovery_s = round(time.monotonic() - t_over, 2)
                except TimeoutError:
                    figs.not_ready_reason = await fleet.not_ready_reason()
                # the load keeps running a little while the fleet is ready again (never past the budget)
                settle_until = min(time.monotonic() + settle, load.started_at + SCENARIO_BUDGET)
                await asyncio.sleep(max(0.0, settle_until - time.monotonic()))
            finally:
                await load.stop()
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
            fails = load.failures()
            figs.requests = len(load.outcomes)
            figs.failed = len(fails)
            figs.failed_by_status = load.statuses()
            figs.failed_streams_cut = sum(1 for o in fails if o.stream and o.bytes_before_failure > 0)
            figs.failures = [f"t{o.end - t_fault:+.2f}s {o.describe()}" for o in fails[:10]]
            figs.outage_s = round(load.longest_gap(t_fault, max(o.end for o in load.outcomes)), 2)
            healthy = [n for n in fleet.nodes if n not in faulted]
            lost = watcher.lost(healthy)
            figs.lost, figs.lost_examples = len(lost), lost[:5]
            figs.extra["coordinator_listings"] = len(watcher.listings)
            if check is not None:
                more += check(load)
    finally:
        if fleet_ref:
            ledger = fleet_ref[0].ledger
            try:
                await wait_for(lambda: not ledger.alive(), timeout=15, what="every process of the fleet gone")
            except TimeoutError:
                figs.orphans = [f"pid {s.pid} pgid {s.pgid}: {s.cmd}" for s in ledger.alive()]
                ledger.kill_leftovers()
            figs.extra["processes_seen"] = len(ledger.seen)
        figs.judge(more)
        figs.write()
    return figs


def assert_figures(figs: Figures) -> None:
    """What the issue demands of every scenario: bounded failures (0 where a redundant path exists),
    fully ready again within the bound, no instance healthy throughout lost, no process left."""
    assert not figs.violations, "; ".join(figs.violations) + "\n" + figs.summary()
