"""Bounded free text for the controller (pure).

The ``detail`` of an endpoint's health and of a fault report comes from places this node does not
control: an HTTP client error quoting a malformed line of the engine's answer, a reason the
engine's own fault publisher sent (a traceback). The controller refuses any request string over
``motor_common.request_limits.MAX_STRING`` characters, and one long detail would make every
heartbeat of the node refused (the node judged lost) and its fault reports too. :func:`clip`
bounds such a text where it is produced: control characters other than newline and tab become a
space, and a text over *limit* characters keeps its start and its end (a traceback's last line
says what failed) around a marker saying how much was cut.
"""

from __future__ import annotations

MAX_DETAIL = 512
_TAIL = 160


def _marker(cut: int) -> str:
    return f" …[{cut} characters cut]… "


def clip(text: str, limit: int = MAX_DETAIL) -> str:
    """*text* printable and at most *limit* characters long (*limit* well above 60)."""
    text = "".join(c if c.isprintable() or c in "\n\t" else " " for c in text)
    if len(text) <= limit:
        return text
    room = limit - len(_marker(len(text)))  # the marker of the cut count is never longer than this
    tail = min(_TAIL, room // 2)
    head = room - tail
    return text[:head] + _marker(len(text) - head - tail) + text[len(text) - tail:]
