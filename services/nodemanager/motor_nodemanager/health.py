"""Health polling of each engine's native ``GET /health``.

Per endpoint: wait for the port (up to ``port_wait_sec``), then probe every ``poll_interval_sec``
with a ``timeout_sec`` budget of this process's responsive time (``motor_common.stall_clock``: a
nodemanager starved of CPU for seconds does not time out a probe whose answer is waiting unread
in its socket, and relaunch a healthy engine for its own stall). 200 → HEALTHY; anything else
(non-200, a redirect, which is not followed, timeout, refused, garbage) → UNHEALTHY, passed on
only as the ``failure_threshold``-th failed probe in a row. Of the body at most ``MAX_BODY`` bytes are read. Each probe carries the generation read *before* it was sent, so the state machine can drop
it if newer controller data arrived meanwhile.

Any program can answer 200, so the first 200 after each (re)start of the poller (a launch, a
relaunch) is believed only once the port is seen to be served by the launched engine process or a
descendant of it (``port_owner``); until then every 200 is UNHEALTHY with a detail saying which
process holds the port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from prometheus_client import Counter

from motor_common.domain import Endpoint
from motor_common.logs import request_id_var
from motor_common.stall_clock import wait_within
from motor_common.tasks import TaskOwner
from motor_nodemanager import port_owner
from motor_nodemanager.detail import clip
from motor_nodemanager.endpoint_state import Observation, failure_streak

log = logging.getLogger(__name__)

# endpoint_id, observation, generation, detail
ObserveFn = Callable[[int, Observation, int, str], None]


@dataclass(frozen=True)
class PollSettings:
    poll_interval_sec: float
    timeout_sec: float
    port_wait_sec: float
    verify_port_owner: bool = True  # health.verify_port_owner
    failure_threshold: int = 1  # health.failure_threshold: failed probes in a row that count


# Probes by outcome: healthy; failed (passed on: the endpoint counts as ABNORMAL); tolerated (a
# failure below health.failure_threshold in a row, logged and not passed on).
PROBES = Counter("motor_nodemanager_health_probes_total", "Engine /health probes, by outcome", ["outcome"])

# The most of a /health body read: only the status counts; the rest is left unread and the
# connection closed (the session's connector is force_close), so no engine can make a probe buffer
# an endless body.
MAX_BODY = 4096


# A probe's wall-clock bound however long this process stalls (its budget counts responsive time).
RAW_TIMEOUT_FACTOR = 10


async def _get_health(session: aiohttp.ClientSession, ep: Endpoint, raw_timeout: float) -> tuple[Observation, str]:
    # A redirect is not followed: only the engine's own answer says the engine is healthy.
    async with session.get(f"{ep.base_url}/health", timeout=aiohttp.ClientTimeout(total=raw_timeout),
                           allow_redirects=False) as resp:
        await resp.content.read(MAX_BODY)  # the first bytes (or the end) of the body, at most MAX_BODY
        if resp.status == 200:
            return Observation.HEALTHY, ""
        return Observation.UNHEALTHY, f"/health answered {resp.status}"


async def probe(session: aiohttp.ClientSession, ep: Endpoint, timeout: float,
                clock: Callable[[], float] = time.monotonic) -> tuple[Observation, str]:
    """One GET /health within *timeout* seconds of *clock* (the stall-compensated clock in the
    nodemanager; at most ``RAW_TIMEOUT_FACTOR`` times *timeout* of wall time whatever it says)."""
    try:
        return await wait_within(clock, timeout, _get_health(session, ep, RAW_TIMEOUT_FACTOR * timeout))
    except TimeoutError:
        return Observation.UNHEALTHY, f"/health timed out after {timeout}s"
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        return Observation.UNHEALTHY, clip(f"/health failed: {type(exc).__name__}: {exc}")  # may quote a long line


async def wait_port(ep: Endpoint, deadline: float) -> bool:
    while time.monotonic() < deadline:
        try:
            async with asyncio.timeout(1.0):
                _, writer = await asyncio.open_connection(ep.ip, ep.business_port)
        except (OSError, TimeoutError):
            await asyncio.sleep(0.2)
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True
    return False


class HealthPoller:
    def __init__(
        self,
        settings: Callable[[], PollSettings],
        generation: Callable[[int], int],
        observe: ObserveFn,
        engine_pid: Callable[[int], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """*engine_pid* (endpoint id -> the launched engine's pid, 0 when none): check once per
        start that the engine serves its port; None: trust any 200 (tests of the poller alone).
        *clock*: what each probe's timeout is counted in (the node's stall-compensated clock)."""
        self._settings = settings
        self._clock = clock
        self._engine_pid = engine_pid
        self._generation = generation
        self._observe = observe
        self._tasks = TaskOwner("health-poller")
        self._session: aiohttp.ClientSession | None = None
        # start/stop are serialised: a stop (shutdown) racing a start (StartEngines) must never leave
        # a probe task running on a session the other one closed.
        self._lock = asyncio.Lock()

    async def start(self, endpoints: list[Endpoint]) -> None:
        async with self._lock:
            await self._stop()
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
            for ep in endpoints:
                self._tasks.spawn(self._run(ep, self._session), name=f"poll-{ep.id}")

    async def _run(self, ep: Endpoint, session: aiohttp.ClientSession) -> None:
        request_id_var.set("")  # a background task, not part of the request that started it
        s = self._settings()
        if not await wait_port(ep, time.monotonic() + s.port_wait_sec):
            log.warning("engine port not open after %ss, polling anyway", s.port_wait_sec, extra={"endpoint_id": ep.id})
        verified = self._engine_pid is None or not s.verify_port_owner
        warned = ""
        streak = 0  # failed probes in a row
        while not session.closed:  # closed = this poller is being stopped: end quietly
            s = self._settings()
            gen = self._generation(ep.id)
            try:
                obs, detail = await probe(session, ep, s.timeout_sec, self._clock)
            except RuntimeError:  # aiohttp: "Session is closed" — closed under us while stopping
                if session.closed:
                    return
                raise
            if obs is Observation.HEALTHY and not verified:
                owner = await self._ownership(ep, s.timeout_sec)
                if owner.owned is False:
                    obs, detail = Observation.UNHEALTHY, owner.detail
                    if detail != warned:
                        log.warning("engine not healthy: %s", detail, extra={"endpoint_id": ep.id})
                        warned = detail
                elif owner.owned:
                    verified = True
                    if warned:
                        log.info("engine port %d is served by the engine now", ep.business_port,
                                 extra={"endpoint_id": ep.id})
                # None: cannot tell (no /proc): this 200 counts; check again
            streak, counts = failure_streak(streak, obs, s.failure_threshold)
            PROBES.labels("healthy" if obs is Observation.HEALTHY else "failed" if counts else "tolerated").inc()
            if counts:
                self._observe(ep.id, obs, gen, detail)
            else:
                log.info("engine /health failed (%d of %d in a row before it counts): %s", streak,
                         s.failure_threshold, detail, extra={"endpoint_id": ep.id})  # fmt: skip
            await asyncio.sleep(s.poll_interval_sec)

    async def _ownership(self, ep: Endpoint, timeout: float) -> port_owner.Ownership:
        assert self._engine_pid is not None
        pid = self._engine_pid(ep.id)
        try:
            async with asyncio.timeout(max(timeout, 1.0)):  # /proc reads: off the loop and bounded
                return await asyncio.to_thread(port_owner.check, pid, ep.ip, ep.business_port)
        except Exception as exc:  # never let the check itself take an engine down
            log.warning("could not check which process serves port %d: %s: %s", ep.business_port,
                        type(exc).__name__, exc, extra={"endpoint_id": ep.id})
            return port_owner.Ownership(None)

    async def stop(self) -> None:
        async with self._lock:
            await self._stop()

    async def _stop(self) -> None:
        await self._tasks.close()
        self._tasks = TaskOwner("health-poller")
        if self._session is not None:
            await self._session.close()
            self._session = None
