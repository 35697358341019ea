"""A program's configuration error, told in terms of the operator's own fleet file (pure, no I/O).

``motor up`` generates one configuration file per program and deep-merges the operator's
``--config`` sections into them, so a program that rejects its configuration names the
*generated* file. :func:`explain` turns that back into the operator's file, section and key:

    program:  error: .motor/up/coordinator.yaml: unknown configuration key 'schedular' (did you mean 'scheduler'?); …
    operator: typo.yaml: unknown configuration key 'coordinator.schedular' (did you mean 'scheduler'?); …
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_UNKNOWN = re.compile(r"^unknown configuration key '([^']+)'(.*)$", re.S)
_AT_PATH = re.compile(r"^([A-Za-z_][\w.\[\]]*): (.*)$", re.S)


def error_line(log_text: str) -> str:
    """The program's own one-line error (``error: …``, as every program prints it before exiting
    2), the last one in *log_text*; empty when there is none."""
    lines = [line for line in log_text.splitlines() if line.startswith("error: ")]
    return lines[-1].removeprefix("error: ").strip() if lines else ""


def _root(path: str) -> str:
    return path.split(".", 1)[0].split("[", 1)[0]


def explain(message: str, section: str, generated: str, user_file: str | None,
            overrides: Mapping[str, Any]) -> str:
    """*message* (a program's ConfigError) in terms of *user_file* when the offending key comes
    from the operator's *section*; else *message* unchanged (it names the generated file, or is
    not about a key at all, e.g. a busy port)."""
    if not message.startswith(f"{generated}: "):
        return message
    text = message.removeprefix(f"{generated}: ")
    mine = overrides if isinstance(overrides, Mapping) else {}
    unknown = _UNKNOWN.match(text)
    if unknown:
        key, rest = unknown.groups()
        if user_file and _root(key) in mine:
            return f"{user_file}: unknown configuration key '{section}.{key}'{rest}"
        return message
    at = _AT_PATH.match(text)
    if at:
        key, rest = at.groups()
        if user_file and _root(key) in mine:
            return f"{user_file}: {section}.{key}: {rest}"
    return message
