"""Engine re-adoption: what a nodemanager launched, recorded so that its next incarnation — after it
died abnormally (SIGKILL, OOM kill, crash) — takes over the engines still running instead of
launching new ones (a vLLM engine takes minutes to load a model).

The record is a small JSON state file, written atomically (temp file + rename), one entry per engine:
pid, process group, the process start time (``/proc/<pid>/stat`` field 22, clock ticks since boot: a
reused pid never matches it), the engine's ports and a fingerprint of its launch plan (argv + env).
An engine is adopted only when its pid runs with the recorded start time *and* the plan the new
incarnation would launch has the same fingerprint (same config, same instance, same ports).

This module is pure apart from reading ``/proc`` and the state file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from prometheus_client import Counter

from motor_common.atomic_file import write_atomic
from motor_common.domain import Endpoint
from motor_nodemanager.launch import LaunchPlan

log = logging.getLogger(__name__)

VERSION = 1
MAX_RECORDS = 256  # bounds the file: a node runs a handful of engines
MAX_BYTES = 256 * 1024


@dataclass(frozen=True)
class EngineRecord:
    endpoint_id: int
    pid: int
    pgid: int
    start_time: int  # /proc/<pid>/stat field 22 (clock ticks after boot)
    fingerprint: str
    business_port: int = 0
    kv_port: int = 0
    bootstrap_port: int = 0
    kv_events_port: int = 0
    kv_events_replay_port: int = 0
    started_at: float = 0.0  # wall-clock seconds, for the "age" in logs


def fingerprint(plan: LaunchPlan) -> str:
    """A digest of what the process is launched with: argv and the full environment (ports, the
    instance id and every config-driven flag are in there)."""
    body = json.dumps([list(plan.argv), sorted(plan.env.items())], separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def start_time_of(stat: str) -> int | None:
    """Field 22 (starttime) of a ``/proc/<pid>/stat`` line; None when it cannot be parsed. Fields
    after the command name (in parentheses, which may hold spaces and parentheses) start at 3."""
    fields = stat.rpartition(")")[2].split()
    if len(fields) < 20 or not fields[19].isdigit():
        return None
    return int(fields[19])


def process_start_time(pid: int) -> int | None:
    """The start time of *pid*, None when no such process runs (or it is a zombie: it ran out)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    state = text.rpartition(")")[2].split()[:1]
    if state and state[0] in ("Z", "X"):
        return None
    return start_time_of(text)


def is_recorded_process(rec: EngineRecord) -> bool:
    """Whether *rec*'s pid still runs the very process that was recorded (same start time)."""
    return rec.pid > 0 and process_start_time(rec.pid) == rec.start_time


def record_of(plan: LaunchPlan, pid: int, started_at: float) -> EngineRecord | None:
    start = process_start_time(pid)
    if start is None:
        return None
    e = plan.endpoint
    return EngineRecord(e.id, pid, pid, start, fingerprint(plan), e.business_port, e.kv_port, e.bootstrap_port,
                        e.kv_events_port, e.kv_events_replay_port, started_at)  # fmt: skip


def save(path: str, records: Sequence[EngineRecord]) -> None:
    """Write *records* atomically (an empty list removes the file). OS errors are logged: a node
    that cannot record its engines still runs them (they just cannot be adopted)."""
    try:
        if not records:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
        body = json.dumps({"version": VERSION, "engines": [asdict(r) for r in records[:MAX_RECORDS]]}, indent=1)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, body, durable=True)
    except OSError as exc:
        log.warning("could not write the engine state file (engines cannot be re-adopted): %s", exc,
                    extra={"path": path})  # fmt: skip


def load(path: str) -> list[EngineRecord]:
    """The recorded engines; [] when there is no file, and (with a warning) when it is unreadable."""
    try:
        with open(path) as f:
            text = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.warning("engine state file unreadable: %s", exc, extra={"path": path})
        return []
    try:
        if len(text) > MAX_BYTES:
            raise ValueError(f"larger than {MAX_BYTES} bytes")
        doc = json.loads(text)
        if doc.get("version") != VERSION:
            raise ValueError(f"version {doc.get('version')!r}")
        return [_checked(EngineRecord(**e)) for e in doc["engines"][:MAX_RECORDS]]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("engine state file ignored (not a valid record): %s", exc, extra={"path": path})
        return []


def _checked(rec: EngineRecord) -> EngineRecord:
    """*rec* as read from the file, its field types checked (a hand-edited or corrupted file must
    not stop the nodemanager later, when a pid is compared or signalled)."""
    ints = [v for k, v in vars(rec).items() if k not in ("fingerprint", "started_at")]
    if any(type(v) is not int or not 0 <= v < 2**31 for v in ints):
        raise ValueError("pids and ports must be integers in [0, 2^31)")
    if not isinstance(rec.fingerprint, str) or type(rec.started_at) not in (int, float):
        raise ValueError("fingerprint must be a string and started_at a number")
    return rec


def state_path(explicit: str | None, log_dir: str | None, prefix: str) -> str | None:
    """``engine.state_file``, else ``<engine.log_dir>/<prefix>.engines.json``; None when neither is
    configured (then nothing is recorded and nothing adopted)."""
    if explicit:
        return explicit
    if not log_dir:
        return None
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in prefix).strip(".")
    return str(Path(log_dir) / (f"{safe}.engines.json" if safe else "engines.json"))


def with_recorded_ports(planned: Iterable[Endpoint], records: Iterable[EngineRecord]) -> tuple[Endpoint, ...]:
    """*planned* endpoints with the ports of the recorded engines of the same id (the ports a
    previous incarnation picked from the OS are the ones its engines still listen on)."""
    by_id = {r.endpoint_id: r for r in records}
    out = []
    for e in planned:
        r = by_id.get(e.id)
        if r is not None and r.business_port:
            e = replace(e, business_port=r.business_port, kv_port=r.kv_port, bootstrap_port=r.bootstrap_port,
                        kv_events_port=r.kv_events_port, kv_events_replay_port=r.kv_events_replay_port)
        out.append(e)
    return tuple(out)


# Recorded engines at a nodemanager's start, by outcome: adopted, gone (process gone or pid reused:
# not signalled), mismatch (launch plan changed or the instance's other engines gone: stopped).
ADOPTIONS = Counter("motor_nodemanager_engine_adoptions_total",
                    "Engines recorded by a previous nodemanager, by what became of them at the start", ["outcome"])
