"""When the gateway's supervisor restarts a worker and when it declares one unresponsive (pure
decisions, no I/O; ``motor_gateway.workers`` acts on them).

A worker that dies is restarted at once the first time; a worker that keeps dying soon after its
start (a crash loop) waits longer each time, doubling up to a cap, so a broken worker does not
spin the machine. A worker that stayed up for ``stable_after`` seconds starts the count afresh.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    # The first restart after a quick death waits this long; each further quick death doubles it.
    base_delay: float = 0.1
    max_delay: float = 10.0
    # A worker up at least this long when it died counts as stable: the next restart is immediate.
    stable_after: float = 10.0

    def next_delay(self, uptime: float, quick_deaths: int) -> tuple[float, int]:
        """(seconds to wait before restarting, the new count of consecutive quick deaths) for a
        worker that died after *uptime* seconds, having died *quick_deaths* times quickly before."""
        if uptime >= self.stable_after:
            return 0.0, 0
        delay = min(self.max_delay, self.base_delay * (2 ** min(quick_deaths, 30)))
        return delay, quick_deaths + 1


def unresponsive(now: float, started: float, last_beat: float | None, timeout: float,
                 startup_grace: float) -> bool:
    """Whether a worker must be killed: no heartbeat for *timeout* seconds, or none at all within
    *startup_grace* seconds of its start (imports, TLS files and binding take a while)."""
    if last_beat is None:
        return now - started > startup_grace
    return now - max(last_beat, started) > timeout
