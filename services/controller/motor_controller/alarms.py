"""Alarm store (pure): raise/clear by identity, history, and the precision-alarm index.

Identity = kind + source + sorted instance ids; a CLEAR carries the identity of its RAISE. The
index maps each instance id to the active precision alarms of the P/D groups it belongs to, so a
terminate (or the fault manager) can clear a group's alarms in O(1).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, replace


class AlarmKind(enum.Enum):
    PRECISION = "precision"
    COORDINATOR_PROMOTED = "coordinator_promoted"
    STORE_UNAVAILABLE = "store_unavailable"
    STATE_LOAD_FAILED = "state_load_failed"


class AlarmAction(enum.Enum):
    RAISE = "raise"
    CLEAR = "clear"


AlarmKey = tuple[str, str, tuple[int, ...]]


@dataclass(frozen=True)
class Alarm:
    kind: AlarmKind
    action: AlarmAction
    source: str
    instance_ids: tuple[int, ...]
    address: str = ""
    message: str = ""
    raised_at: float = 0.0  # wall clock

    @property
    def key(self) -> AlarmKey:
        return (self.kind.value, self.source, tuple(sorted(self.instance_ids)))


class AlarmStore:
    """Active alarms by identity, a bounded history of cleared ones, and the precision index."""

    def __init__(self, history: int = 1000) -> None:
        self._active: dict[AlarmKey, Alarm] = {}
        self._cleared: deque[Alarm] = deque(maxlen=history)
        self._precision: dict[int, set[AlarmKey]] = {}

    def report(self, alarm: Alarm) -> Alarm | None:
        """Apply a RAISE or CLEAR; returns the alarm whose activity changed (None = no change)."""
        key = alarm.key
        if alarm.action is AlarmAction.RAISE:
            if key in self._active:
                self._active[key] = replace(alarm, raised_at=self._active[key].raised_at or alarm.raised_at)
                return None
            self._active[key] = alarm
            if alarm.kind is AlarmKind.PRECISION:
                for iid in key[2]:
                    self._precision.setdefault(iid, set()).add(key)
            return alarm
        return self._clear(key, alarm.message)

    def _clear(self, key: AlarmKey, message: str = "") -> Alarm | None:
        active = self._active.pop(key, None)
        if active is None:
            return None
        if active.kind is AlarmKind.PRECISION:
            for iid in key[2]:
                keys = self._precision.get(iid)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._precision[iid]
        cleared = replace(active, action=AlarmAction.CLEAR, message=message or active.message)
        self._cleared.append(cleared)
        return cleared

    def active_precision(self, instance_id: int) -> list[Alarm]:
        return [self._active[k] for k in sorted(self._precision.get(instance_id, ()))]

    def precision_groups(self) -> list[tuple[int, ...]]:
        """P/D groups (sorted instance ids) with an active precision alarm."""
        return sorted({k[2] for keys in self._precision.values() for k in keys})

    def clear_precision(self, instance_id: int, message: str = "") -> list[Alarm]:
        """Clear every active precision alarm whose P/D group contains *instance_id*."""
        out = []
        for key in sorted(self._precision.get(instance_id, set()).copy()):
            cleared = self._clear(key, message)
            if cleared is not None:
                out.append(cleared)
        return out

    def entries(self, active_only: bool = False) -> list[Alarm]:
        active = sorted(self._active.values(), key=lambda a: (a.raised_at, a.key))
        return active if active_only else [*self._cleared, *active]

    def active(self) -> list[Alarm]:
        return list(self._active.values())

    def is_active(self, alarm: Alarm) -> bool:
        return alarm.key in self._active

    def __len__(self) -> int:
        """Active alarms."""
        return len(self._active)

    def other_promotions(self, alarm: Alarm) -> list[Alarm]:
        """Active COORDINATOR_PROMOTED alarms of other coordinators than *alarm*'s: a newer
        promotion ends their term (they are never cleared otherwise)."""
        return [a for k, a in self._active.items() if a.kind is AlarmKind.COORDINATOR_PROMOTED and k != alarm.key]
