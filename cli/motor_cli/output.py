"""Human-readable tables and JSON for instances."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
