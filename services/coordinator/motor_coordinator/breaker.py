"""Per-endpoint circuit breaker (pure; the clock is passed in).

closed --(``failures`` consecutive request/probe failures)--> open
open   --(a passing health probe, at least ``cooldown`` after opening)--> closed

A success while closed resets the failure count. Only the background health probe closes an open
breaker, so an endpoint that failed repeatedly gets no live traffic until ``GET /health`` passes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Breaker:
    failures: int = 3
    cooldown: float = 1.0
    consecutive: int = 0
    opened_at: float | None = None

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None

    def record_failure(self, now: float) -> bool:
        """Count a failure; True when this failure opened the breaker."""
        self.consecutive += 1
        if self.opened_at is None and self.consecutive >= self.failures:
            self.opened_at = now
            return True
        return False

    def trip(self, now: float) -> bool:
        """Open at once (the endpoint hung under a request); True when this opened it."""
        self.consecutive = max(self.consecutive, self.failures)
        if self.opened_at is None:
            self.opened_at = now
            return True
        return False

    def record_success(self) -> None:
        """A request succeeded (does not close an open breaker: only a probe does)."""
        if self.opened_at is None:
            self.consecutive = 0

    def record_probe(self, ok: bool, now: float) -> bool:
        """Apply a health-probe result; True when the open/closed state changed."""
        if not ok:
            return self.record_failure(now)
        if self.opened_at is None:
            self.consecutive = 0
            return False
        if now - self.opened_at >= self.cooldown:
            self.opened_at = None
            self.consecutive = 0
            return True
        return False
