"""The co-located front workers' load, summed per endpoint (no I/O).

Every front worker (``http.workers`` > 1) reports its own in-flight requests and queued prompt
tokens per engine endpoint; each worker is sent the sum of the *other* workers' last reports, which
its scheduler adds to its own counts (``Scheduler.set_peer_loads``). So least load, the load guard
of prefix affinity and the KV-event policy's queued tokens see the whole front's work on an engine,
whichever worker took a request; the view of the others is as old as the last report (a few ms).
"""

from __future__ import annotations

from collections.abc import Mapping

EndpointKey = tuple[str, int]
Load = tuple[int, int]  # (requests in flight, queued prompt tokens)


class LoadTable:
    """The last report of each worker (by the caller's key for it: its stream's serial number)."""

    def __init__(self) -> None:
        self._rows: dict[int, dict[EndpointKey, Load]] = {}

    def report(self, worker: int, loads: Mapping[EndpointKey, Load]) -> bool:
        """Replace *worker*'s row; True when it changed (the other workers are then due an update)."""
        row = {k: v for k, v in loads.items() if v[0] > 0 or v[1] > 0}
        if self._rows.get(worker, {}) == row:
            return False
        if row:
            self._rows[worker] = row
        else:
            self._rows.pop(worker, None)
        return True

    def forget(self, worker: int) -> bool:
        """*worker* is gone (its stream ended): its load no longer counts. True when it had some."""
        return self._rows.pop(worker, None) is not None

    def others(self, worker: int) -> dict[EndpointKey, Load]:
        """The sum of every other worker's row."""
        total: dict[EndpointKey, Load] = {}
        for w, row in self._rows.items():
            if w == worker:
                continue
            for k, (n, t) in row.items():
                old = total.get(k)
                total[k] = (n, t) if old is None else (old[0] + n, old[1] + t)
        return total

    def total(self) -> dict[EndpointKey, Load]:
        """Every worker's load, summed (``others`` of no worker)."""
        return self.others(-1)
