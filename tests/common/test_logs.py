"""motor_common.logs: request ids are version 4 UUIDs' hex, and the formatters' timestamps (one
strftime per second, cached) are what the standard library writes for every record."""

from __future__ import annotations

import logging
import time
import uuid

import orjson

from motor_common.logs import JsonFormatter, TextFormatter, new_request_id, request_id_var


def test_request_ids_are_random_version_4_uuids_in_hex() -> None:
    ids = {new_request_id() for _ in range(20000)}
    assert len(ids) == 20000
    for rid in ids:
        u = uuid.UUID(rid)
        assert len(rid) == 32 and u.hex == rid and u.version == 4 and u.variant == uuid.RFC_4122


def _record(created: float, **extra: object) -> logging.LogRecord:
    r = logging.LogRecord("motor.access", logging.INFO, __file__, 1, "request", None, None)
    r.created = created
    r.msecs = int((created - int(created)) * 1000) + 0.0  # as LogRecord computes it
    r.__dict__.update(extra)
    return r


# within one second, across a second, back again (a clock step): each stamp from scratch
_TIMES = (1764672000.0, 1764672000.4567, 1764672000.9999, 1764672001.0004, 1764672061.25, 1764672000.5)


def test_json_timestamps_equal_strftime_of_each_record() -> None:
    f = JsonFormatter("coordinator")
    token = request_id_var.set("0123456789abcdef0123456789abcdef")
    try:
        for t in _TIMES:
            out = orjson.loads(f.format(_record(t, route="/v1/completions", status=200)))
            want = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t - int(t)) * 1000):03d}Z"
            assert out == {"ts": want, "level": "info", "service": "coordinator", "logger": "motor.access",
                           "msg": "request", "request_id": "0123456789abcdef0123456789abcdef",
                           "route": "/v1/completions", "status": 200}
    finally:
        request_id_var.reset(token)


def test_text_timestamps_equal_the_standard_formatters() -> None:
    ours, stdlib = TextFormatter("coordinator"), logging.Formatter("%(asctime)s")
    for t in _TIMES:
        line = ours.format(_record(t, status=200))
        assert line == f"{stdlib.format(_record(t))} INFO    coordinator motor.access: request status=200"
