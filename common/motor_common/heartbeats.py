"""Heartbeat timing both ends must agree on (pure).

The nodemanager re-opens a broken heartbeat stream with capped exponential back-off
(:func:`reconnect_delay`); the controller derives from the same cap how long a restarted or newly
elected controller waits for the fleet to re-attach before it may judge any node lost
(:func:`default_reattach_grace`).
"""

from __future__ import annotations

RECONNECT_BASE_SEC = 0.25
RECONNECT_CAP_SEC = 5.0


def reconnect_delay(failures: int, base: float = RECONNECT_BASE_SEC, cap: float = RECONNECT_CAP_SEC,
                    addresses: int = 1) -> float:
    """0.25, 0.5, 1, 2, 4, 5, 5, ... seconds; with several controller addresses the delay grows
    only once every address was tried (each failure moves to the next one), so a standby that
    just took over is reached in about one base delay, not after the back-off of the old master."""
    rounds = (max(failures, 1) - 1) // max(addresses, 1)
    return float(min(cap, base * (2**rounds)))


def default_reattach_grace(heartbeat_interval: float, heartbeat_timeout: float) -> float:
    """The re-attach grace of a controller: a nodemanager that lost its stream may be sleeping a
    whole back-off cap when the controller comes back, then its first frame takes up to one interval,
    and the usual heartbeat timeout is kept on top as the tolerance for a busy box."""
    return RECONNECT_CAP_SEC + heartbeat_interval + heartbeat_timeout
