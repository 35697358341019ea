"""When to re-open the connection to a controller address (pure, no I/O).

gRPC keeps one HTTP/2 connection per channel for as long as it is healthy, and a status sent by
a live server (UNAVAILABLE ``NOT_MASTER`` from a demoted HA controller) does not make the channel
reconnect. Behind one Service address (Kubernetes ``motor-controller``) the connection is pinned
to the pod it was opened to: only a *new* connection is balanced to the pod that is master now.

:class:`ReopenPolicy` decides, per address, when a failed call calls for a new connection:

- a ``NOT_MASTER`` refusal: at once (the peer is alive and will keep refusing);
- ``REOPEN_AFTER_FAILURES`` peer failures in a row (UNAVAILABLE, DEADLINE_EXCEEDED) of any other
  reason: the connection may be pinned to a pod that stopped answering usefully;

and never twice within the back-off: 0 s before the first re-open, then ``REOPEN_BASE_SEC``
doubling up to ``REOPEN_CAP_SEC`` (a new connection may land on the old pod until the Service drops
it from its endpoints). A successful call resets both counts. A failure caused by our own re-open
(``CONNECTION_REOPENED``: a call cut short when the old channel was closed) is not counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NOT_MASTER = "NOT_MASTER"
CONNECTION_REOPENED = "CONNECTION_REOPENED"
REOPEN_AFTER_FAILURES = 3
REOPEN_BASE_SEC = 0.5
REOPEN_CAP_SEC = 5.0


@dataclass
class ReopenPolicy:
    failures: int = 0  # peer failures in a row since the last success or re-open
    reopens: int = 0  # re-opens since the last success
    last_reopen: float = -math.inf

    def backoff(self) -> float:
        """The least time between the previous re-open and the next one."""
        if self.reopens == 0:
            return 0.0
        return float(min(REOPEN_CAP_SEC, REOPEN_BASE_SEC * 2 ** (self.reopens - 1)))

    def failed(self, reason: str, now: float) -> bool:
        """A call to this address failed UNAVAILABLE or DEADLINE_EXCEEDED with *reason*: True when
        the connection must be re-opened now (the re-open is then counted)."""
        if reason == CONNECTION_REOPENED:
            return False
        self.failures += 1
        if reason != NOT_MASTER and self.failures < REOPEN_AFTER_FAILURES:
            return False
        if now - self.last_reopen < self.backoff():
            return False
        self.reopens += 1
        self.failures = 0
        self.last_reopen = now
        return True

    def succeeded(self) -> None:
        self.failures = 0
        self.reopens = 0
