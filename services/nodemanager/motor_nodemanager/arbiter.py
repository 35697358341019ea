"""Self-termination arbitration: the daemon asks once per interval whether the node must die. Pure.

An endpoint counts against the node when it is ABNORMAL **and has once been NORMAL** since its last
launch (a slow model load is not a death). After ``threshold`` consecutive ABNORMAL intervals the
verdict is "terminate" (stop engines, exit with the reschedule code), unless arbitration is frozen:
an engine relaunch in place is expected (fault-tolerance), until a deadline that expires by itself.
Nothing is counted while the endpoint states are about to be replaced (``replacing``: a start command
is running, or engines restored from a snapshot wait for the start command that adopts or replaces
them): a streak then starts from zero with the new engines.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from motor_common.domain import EndpointStatus
from motor_nodemanager.endpoint_state import EndpointState


@dataclass(frozen=True)
class Verdict:
    terminate: bool
    reason: str = ""
    # endpoint id -> consecutive ABNORMAL intervals (only endpoints that were once NORMAL)
    streaks: tuple[tuple[int, int], ...] = ()
    frozen: bool = False
    freeze_expired: bool = False


class Arbiter:
    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self._streaks: dict[int, int] = {}
        self._frozen_until: float | None = None

    # --- freeze seam (fault tolerance) ----------------------------------------------------
    def freeze(self, until: float) -> None:
        self._frozen_until = until if self._frozen_until is None else max(self._frozen_until, until)

    def unfreeze(self) -> None:
        self._frozen_until = None

    @property
    def frozen_until(self) -> float | None:
        return self._frozen_until

    def is_frozen(self, now: float) -> bool:
        return self._frozen_until is not None and now < self._frozen_until

    def reset(self) -> None:
        """Forget the streaks (engines relaunched)."""
        self._streaks.clear()

    # --- the decision ---------------------------------------------------------------------
    def tick(self, endpoints: Iterable[EndpointState], now: float, *, replacing: bool = False) -> Verdict:
        expired = self._frozen_until is not None and now >= self._frozen_until
        if expired:
            self._frozen_until = None
        if replacing:
            self._streaks = {}
            return Verdict(False, "", (), self.is_frozen(now), expired)
        streaks: dict[int, int] = {}
        for ep in endpoints:
            if ep.status is EndpointStatus.ABNORMAL and ep.was_normal:
                streaks[ep.endpoint_id] = self._streaks.get(ep.endpoint_id, 0) + 1
        self._streaks = streaks
        frozen = self.is_frozen(now)
        worst = max(streaks.items(), key=lambda kv: kv[1], default=None)
        ordered = tuple(sorted(streaks.items()))
        if worst is not None and worst[1] >= self.threshold and not frozen:
            reason = f"endpoint {worst[0]} ABNORMAL for {worst[1]}/{self.threshold} consecutive intervals"
            return Verdict(True, reason, ordered, frozen, expired)
        return Verdict(False, "", ordered, frozen, expired)
