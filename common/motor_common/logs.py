"""Structured logging: one JSON object per line, with the current request id.

The text format (``log.format: text``) is for people, and stays one line per record whatever a
client or an engine put in it: control characters of the message and of the ``key=value`` fields
are escaped (``\\n``, ``\\x1b``…), a field value with a space, quote or ``=`` is quoted, and the
lines of a traceback are indented, so a line that starts at column 0 always starts a record.

``request_id_var`` is a ContextVar; the gRPC chassis sets it from the ``x-request-id`` metadata
(or a fresh id), the gateway from the ``X-Request-Id`` header, so every log line of one request,
in every process, carries the same id.
"""

from __future__ import annotations

import logging
import re
import sys
import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

import orjson

request_id_var: ContextVar[str] = ContextVar("motor_request_id", default="")

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True)
class LogConfig:
    """The ``log`` section every Motor program's configuration shares."""

    level: str = "INFO"
    format: Literal["json", "text"] = "json"

    def __post_init__(self) -> None:
        if self.level.upper() not in _LEVELS:
            raise ValueError(f"log.level {self.level!r} is not one of {', '.join(_LEVELS)}")


def new_request_id() -> str:
    return uuid.uuid4().hex


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = request_id_var.get()
        if rid:
            out["request_id"] = rid
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


# C0 and C1 control characters, DEL, and the Unicode line and paragraph separators
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_BUT_NEWLINE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_NEEDS_QUOTES = re.compile(r'[\s"=\x00-\x1f\x7f-\x9f\u2028\u2029]')


def _escape_char(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) <= 0xFF else f"\\u{ord(c):04x}")


def one_line(text: str) -> str:
    """*text* with its control characters escaped: safe as (part of) one log line."""
    return _CONTROL.sub(_escape_char, text)


def _field(value: Any) -> str:
    """A ``key=value`` field's value: as it is, or quoted (backslash escapes) when it holds a
    space, a quote, an ``=`` or a control character, or is empty."""
    text = str(value)
    if text and not _NEEDS_QUOTES.search(text):
        return text
    return '"' + one_line(text.replace("\\", "\\\\").replace('"', '\\"')) + '"'


class TextFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__("%(asctime)s %(levelname)-7s " + service + " %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.message = one_line(record.getMessage())
        record.asctime = self.formatTime(record, self.datefmt)
        line = self.formatMessage(record)
        extras = {
            k: v for k, v in record.__dict__.items() if k not in _RESERVED and not k.startswith("_")
        }
        rid = request_id_var.get()
        if rid:
            extras["request_id"] = rid
        if extras:
            line += " " + " ".join(f"{k}={_field(v)}" for k, v in extras.items())
        for tail in (
            self.formatException(record.exc_info) if record.exc_info else "",
            self.formatStack(record.stack_info) if record.stack_info else "",
        ):
            if tail:
                line += "".join(
                    "\n    " + ln for ln in _CONTROL_BUT_NEWLINE.sub(_escape_char, tail).split("\n")
                )
        return line


def setup_logging(service: str, level: str = "INFO", fmt: str = "json") -> None:
    """Configure the root logger for *service* (``fmt``: ``json`` or ``text``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service) if fmt == "json" else TextFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aiohttp.access", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
