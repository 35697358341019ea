"""The text log format keeps one record on its own line(s) whatever a client or an engine put in
its message, its fields or its exception."""

from __future__ import annotations

import logging
import sys

from motor_common.logs import TextFormatter

FORGED = "2026-01-01 00:00:00,000 CRITICAL coordinator motor.audit: operator logged in"


def _record(msg: str, args: tuple[object, ...] = (), **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("motor.test", logging.WARNING, __file__, 1, msg, args, None)
    rec.__dict__.update(extra)
    return rec


def test_newlines_and_escape_bytes_in_a_message_or_a_field_stay_on_the_records_line() -> None:
    rec = _record(
        "engine answered: %s",
        (f"boom\r\n{FORGED}\x1b[2J\u2028x",),
        error=f"E: x\n{FORGED}",
        model='m status=200 "q" \\',
        plain="ok",
    )
    line = TextFormatter("coordinator").format(rec)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\u2028" not in line
    assert f"boom\\r\\n{FORGED}\\x1b[2J\\u2028x" in line
    # a value with a space, a quote or '=' is quoted, so no field can be forged inside it
    assert line.endswith(f' error="E: x\\n{FORGED}" model="m status=200 \\"q\\" \\\\" plain=ok')


def test_every_line_of_a_traceback_is_indented_so_only_records_start_at_column_0() -> None:
    try:
        raise ValueError(f"bad value\n{FORGED}\x1b[31m")
    except ValueError:
        rec = logging.LogRecord("motor.test", logging.ERROR, __file__, 1, "failed", (), None)
        rec.exc_info = sys.exc_info()
    lines = TextFormatter("coordinator").format(rec).split("\n")
    assert lines[0].endswith("motor.test: failed")
    assert len(lines) > 3 and all(ln.startswith("    ") for ln in lines[1:]), lines
    assert f"    {FORGED}\\x1b[31m" in lines
