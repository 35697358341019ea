"""Strict configuration loading: a file (JSON or YAML) plus environment overrides.

Configuration schemas are (nested) dataclasses. Every key in the file must name a field: an
unknown or misspelled key is a :class:`~motor_common.errors.ConfigError` naming the full key path
and, when one is close, the field that was probably meant. Types are checked, not coerced, except
that ints are accepted where floats are expected. Floats must be finite, and a float whose key ends
in ``_sec``, ``_seconds``, ``interval`` or ``_ttl`` is a duration: 0 to one year. A file must be UTF-8,
at most :data:`MAX_CONFIG_BYTES`, with no key twice in one mapping. Every error is one line (a
wrong value is shown clipped).

Environment overrides: ``{PREFIX}__SECTION__KEY=value`` (double underscores separate levels; the
value is parsed as a YAML scalar/flow value). An override naming no field is an error too.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import reprlib
import select
import stat
import time
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from motor_common.errors import ConfigError

T = TypeVar("T")


# A Motor configuration file is a few kilobytes; past this it is the wrong file (a log, a model's
# weights), and pure-Python YAML parsing takes seconds per megabyte.
MAX_CONFIG_BYTES = 1024 * 1024
_YamlLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# A pipe given as a config (``--config <(render-config)``) must be written to completion within this.
PIPE_READ_TIMEOUT_SEC = 10.0


def _read_bounded(p: Path, limit: int) -> bytes:
    """At most *limit* bytes of *p*. A regular file is read; a pipe or a character device (process
    substitution, ``/dev/stdin``) until its end, for at most :data:`PIPE_READ_TIMEOUT_SEC` — it is
    opened without blocking, so a named pipe nobody writes to reads as empty instead of hanging the
    program for ever; anything else (a directory, a socket, a block device) is refused."""
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode):
            os.set_blocking(fd, True)
            with os.fdopen(os.dup(fd), "rb") as f:
                return f.read(limit)
        if not (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
            raise ConfigError(f"config file {p} is not a regular file")
        chunks: list[bytes] = []
        size, deadline = 0, time.monotonic() + PIPE_READ_TIMEOUT_SEC
        while size < limit:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConfigError(f"config file {p} is a pipe that was not written to its end within "
                                  f"{PIPE_READ_TIMEOUT_SEC:g} s")  # fmt: skip
            try:  # read first: a FIFO that never had a writer reads as its end but never polls readable
                chunk = os.read(fd, min(65536, limit - size))
            except BlockingIOError:
                select.select([fd], [], [], left)
                continue
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if not size:
            raise ConfigError(f"config file {p} is a pipe with nothing written to it (does anything write to it?)")
        return b"".join(chunks)
    finally:
        os.close(fd)


class _StrictLoader(_YamlLoader):  # type: ignore[misc]
    """YAML's safe loader refusing a key given twice in one mapping (YAML keeps the last one
    silently, so which of two ``port:`` lines wins depends on their order). Keys brought in by a
    merge key (``<<: *defaults``) may still be overridden."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
                seen[key] = line
            except TypeError:
                continue  # an unhashable key: the base class says so
            if first is not None:
                raise _YamlProblem(
                    f"key {key!r} is given twice in one mapping (line {first} and line {line})"
                )
        return dict(super().construct_mapping(node, deep=deep))


class _YamlProblem(yaml.YAMLError):
    """A YAML error told in one line."""


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """*exc* in one line: where (line, column) and what (PyYAML's own text spans several lines)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        where = f"line {exc.problem_mark.line + 1}, column {exc.problem_mark.column + 1}"
        what = "; ".join(part for part in (exc.context, exc.problem) if part)
        return f"{where}: {what}"
    return " ".join(str(exc).split())


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a JSON or YAML mapping from *path*: UTF-8, at most :data:`MAX_CONFIG_BYTES`, no key
    twice in one mapping."""
    p = Path(path)
    try:
        raw = _read_bounded(p, MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from exc
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"config file {p} is larger than {MAX_CONFIG_BYTES // 1024} KiB (a Motor configuration is a "
            f"few kilobytes): is it the right file?"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {p} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        ) from exc
    kind = "JSON" if p.suffix == ".json" else "YAML"
    try:
        data = (
            json.loads(text, object_pairs_hook=_unique_keys)
            if kind == "JSON"
            else yaml.load(text, _StrictLoader)
        )
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {p} is not valid YAML: {_yaml_problem(exc)}") from exc
    except ValueError as exc:  # JSON syntax, or in either an integer of more than 4300 digits
        raise ConfigError(f"config file {p} is not valid {kind}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping at the top level")
    return data


def _env_overrides(prefix: str, environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    marker = prefix + "__"
    for name, raw in environ.items():
        if not name.startswith(marker):
            continue
        path = [part.lower() for part in name[len(marker) :].split("__")]
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"environment override {name} conflicts with another override")
        node[path[-1]] = value
    return out


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


# A float setting whose name ends so is a duration in seconds (every one in Motor's configurations
# is); past a year it is a typo, and gRPC fails a call at once when its timeout is ~7e9 s or more.
_DURATION_SUFFIXES = ("_sec", "_seconds", "interval", "_ttl")
MAX_DURATION_SEC = 365 * 24 * 3600
# How much of a wrong value an error shows: a YAML alias bomb (a list of 9 aliases of a list of 9
# aliases …) is small in memory, but its full repr is billions of characters.
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 2, 60, 60
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 4


def _shown(value: Any) -> str:
    return _SHOWN.repr(value)


def _finite(value: Any) -> float | None:
    """*value* as a finite float, or None (not a number, NaN, infinite, an int past a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, where)
            except ConfigError as exc:
                errors.append(exc.message)
        raise ConfigError(
            errors[0]
            if len(errors) == 1
            else f"{where}: {_shown(value)} matches none of {_type_name(tp)}"
        )
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(
                f"{where}: {_shown(value)} is not one of {', '.join(repr(a) for a in args)}"
            )
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        return build(tp, value, where)
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
        item = args[0] if args else Any
        items = [_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        vt = args[1] if len(args) == 2 else Any
        return {str(k): _convert(v, vt, f"{where}.{k}") for k, v in value.items()}
    if tp is float:
        number = _finite(value)
        if number is None:
            raise ConfigError(f"{where}: expected a finite number, got {_shown(value)}")
        if where.endswith(_DURATION_SUFFIXES) and not 0 <= number <= MAX_DURATION_SEC:
            raise ConfigError(
                f"{where}: {number:g} is not a duration in seconds from 0 to {MAX_DURATION_SEC} "
                f"(one year)"
            )
        return number
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {_shown(value)}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {_shown(value)}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {_shown(value)}")
        return value
    raise ConfigError(f"{where}: unsupported config type {_type_name(tp)}")


def build(cls: type[T], data: Mapping[str, Any], where: str = "") -> T:
    """Build dataclass *cls* from *data*, rejecting unknown keys and wrong types."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            known = ", ".join(sorted(fields))
            raise ConfigError(f"unknown configuration key '{path}'{hint}; known keys here: {known}")
        kwargs[key] = _convert(value, hints[key], path)
    try:
        obj = cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{where or 'config'}: {exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"{where or 'config'}: {exc}") from exc
    return obj


def load_config(
    cls: type[T],
    path: str | Path | None = None,
    *,
    env_prefix: str | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> T:
    """Load *cls* from an optional file, then env overrides, then explicit *overrides*."""
    data: dict[str, Any] = read_config_file(path) if path else {}
    if env_prefix:
        data = _merge(data, _env_overrides(env_prefix, os.environ if environ is None else environ))
    if overrides:
        data = _merge(data, overrides)
    try:
        return build(cls, data)
    except ConfigError as exc:
        if path:
            raise ConfigError(f"{path}: {exc.message}") from exc
        raise


def to_dict(obj: Any) -> Any:
    """A dataclass config as plain data (for logging the effective configuration)."""
    return (
        dataclasses.asdict(obj)
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type)
        else obj
    )
