"""Human-readable tables and JSON for instances, and the terminal guard of every ``motor`` command.

Names, reasons, alarm messages and error details come from servers, engines and logs: a control
character among them (ESC opens an ANSI sequence that can retitle the terminal, clear it or hide
text; C1 and DEL likewise) must never reach the operator's terminal. :class:`SafeText` wraps
stdout and stderr once in ``motor``'s ``main`` and writes each such character as ``\\uXXXX`` (a
JSON escape: ``--json`` output stays valid JSON); newlines and tabs pass.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, TextIO

import orjson

from motor_common.domain import Instance


def endpoint_text(inst: Instance) -> str:
    parts = []
    for ep in inst.endpoints:
        text = ep.host_port
        if ep.bootstrap_port:
            text += f",bootstrap={ep.bootstrap_port}"
        if ep.kv_port:
            text += f",kv={ep.kv_port}"
        if ep.kv_events_port:
            text += f",kv_events={ep.kv_events_port}"
        if ep.kv_events_replay_port:
            text += f",kv_events_replay={ep.kv_events_replay_port}"
        parts.append(text)
    return " ".join(parts)


def instance_dict(inst: Instance) -> dict[str, Any]:
    return {
        "id": inst.id,
        "role": inst.role.value,
        "job": inst.job_name,
        "model": inst.model_name,
        "engine": inst.engine_type.value,
        "status": inst.status.value,
        "endpoints": [
            {"id": ep.id, "ip": ep.ip, "port": ep.business_port, "bootstrap_port": ep.bootstrap_port,
             "kv_port": ep.kv_port, "dp_rank": ep.dp_rank, "kv_events_port": ep.kv_events_port,
             "kv_events_replay_port": ep.kv_events_replay_port}
            for ep in inst.endpoints
        ],
    }


def grid(header: Sequence[str], body: Sequence[Sequence[str]], empty: str = "(none)") -> str:
    """Left-aligned columns; the last column is not padded."""
    rows = [tuple(header), *(tuple(r) for r in body)]
    widths = [max(len(r[c]) for r in rows) for c in range(len(header) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]
    if not body:
        lines.append(empty)
    return "\n".join(line.rstrip() for line in lines)


def table(instances: Sequence[Instance]) -> str:
    header = ("ID", "ROLE", "MODEL", "ENGINE", "STATUS", "JOB", "ENDPOINTS")
    body = [
        (str(i.id), i.role.value, i.model_name, i.engine_type.value, i.status.value, i.job_name, endpoint_text(i))
        for i in instances
    ]
    return grid(header, body, "(no instances)")


def dumps(obj: Any) -> str:
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode()


# C0 controls but tab and newline, DEL, C1 controls.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """*text* with every control character but tab and newline written as ``\\uXXXX``."""
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class SafeText:
    """A text stream that writes :func:`printable` text to *stream* (everything else delegated)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(printable(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
