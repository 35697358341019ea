"""When a worker supervisor restarts a worker and when it declares one unresponsive (pure
decisions, no I/O; ``motor_common.worker_supervisor`` acts on them, for the gateway's workers and
the coordinator's front workers).

A worker that dies is restarted at once the first time; a worker that keeps dying soon after its
start (a crash loop) waits longer each time, doubling up to a cap, so a broken worker does not
spin the machine. A worker that stayed up for ``stable_after`` seconds starts the count afresh.

The admission limits that count requests are the whole front's: worker *i* of *N* enforces its
share (:func:`admission_share`), and the shares add up to the configured limit. The byte bounds
bound one process's memory and stay per worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from motor_common.openai_front.admission import AdmissionConfig

# Admission keys that count requests: split over the workers (0 = unbounded stays 0).
SPLIT_IN_FLIGHT = ("max_in_flight_per_model", "max_in_flight_per_key")
# A queue share of 0 means "no waiting" on that worker, which still keeps the front's total.
SPLIT_QUEUED = ("max_queued_per_model", "max_queued_per_key")


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
    *startup_grace* seconds of its start (imports, TLS files and binding take a while). Every time
    is the supervisor's monotonic clock (:class:`Heartbeat` gives *last_beat*)."""
    if last_beat is None:
        return now - started > startup_grace
    return now - max(last_beat, started) > timeout


@dataclass
class Heartbeat:
    """One worker's heartbeat as the supervisor sees it. The worker stamps a file with the wall
    clock; the stamp is only compared with the previous one, never with a clock: a beat is a
    change of stamp, dated by the supervisor's monotonic *now*. A wall-clock step (NTP, a VM
    resumed) therefore neither makes a healthy worker look silent nor a silent one look alive."""

    started: float  # monotonic time of the spawn
    stamp: int | None = field(default=None, init=False)  # the file's last stamp seen (st_mtime_ns)
    seen: float | None = field(default=None, init=False)  # monotonic time it was seen to change

    def observe(self, now: float, stamp: int | None) -> None:
        """The file's stamp at *now* (None: no beat file yet)."""
        if stamp is not None and stamp != self.stamp:
            self.stamp, self.seen = stamp, now

    def unresponsive(self, now: float, timeout: float, startup_grace: float) -> bool:
        return unresponsive(now, self.started, self.seen, timeout, startup_grace)


def share(limit: int, index: int, workers: int) -> int:
    """Worker *index*'s part of a front-wide *limit* over *workers* processes: ``limit // workers``
    plus one for the first ``limit % workers`` workers, so the parts add up to *limit*."""
    if not 0 <= index < workers:
        raise ValueError(f"worker index {index} outside [0, {workers})")
    return limit // workers + (1 if index < limit % workers else 0)


def admission_too_small(cfg: AdmissionConfig, workers: int) -> str | None:
    """Why *cfg* cannot be split over *workers* processes, or None. A nonzero in-flight limit
    smaller than the number of workers would give some worker a share of 0, which the
    configuration reads as unbounded (and a worker that refused everything instead would turn
    away every client the kernel happens to hand it while the others idle)."""
    if workers <= 1:
        return None
    for name in SPLIT_IN_FLIGHT:
        limit = getattr(cfg, name)
        if 0 < limit < workers:
            return (f"admission.{name} is {limit} but workers is {workers}: the limit is the whole "
                    f"front's, split over the workers, so it must be 0 (unbounded) or at least "
                    f"{workers} (one request per worker)")
    return None


def admission_share(cfg: AdmissionConfig, index: int, workers: int) -> AdmissionConfig:
    """What worker *index* of *workers* enforces: its share of each count limit (0 stays 0), the
    byte bounds, timeout and Retry-After unchanged (they bound one process)."""
    if workers <= 1:
        return cfg
    reason = admission_too_small(cfg, workers)
    if reason is not None:
        raise ValueError(reason)
    return replace(cfg, **{name: share(getattr(cfg, name), index, workers)
                           for name in (*SPLIT_IN_FLIGHT, *SPLIT_QUEUED)})
