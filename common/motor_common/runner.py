"""Process entry helpers: event loop choice, signals, exit codes."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

import orjson

from motor_common.atomic_file import write_atomic
from motor_common.errors import ConfigError

log = logging.getLogger(__name__)

EXIT_CONFIG = 2
# Exit code a nodemanager uses when it terminates itself so that it is rescheduled.
EXIT_RESCHEDULE = 75


def install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def stop_event_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT (must be called inside the running loop)."""
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, event.set)
    return event


def run(main: Callable[[], Coroutine[Any, Any, int | None]]) -> int:
    """Run *main* on uvloop; a ConfigError prints its message and exits 2."""
    install_uvloop()
    try:
        code = asyncio.run(main())
    except ConfigError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return 130
    return int(code or 0)


def write_ports_file(path: str, ports: Mapping[str, int | None]) -> None:
    """Write the bound ports as JSON atomically (temp file + rename in the same directory), so a
    reader (tests, ``motor up``) never sees half a file. Every program's ``--ports-file``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, orjson.dumps(dict(ports)))


def check_config(load: Callable[[], object]) -> int:
    """``--check-config`` of every program: load the configuration with the program's own loader
    (file, environment overrides, flags), print ``configuration OK`` and return 0, or print the
    error and return 2 (:data:`EXIT_CONFIG`). Nothing is started."""
    try:
        load()
    except ConfigError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_CONFIG
    print("configuration OK")
    return 0


DOCS_HINT = "Docs: README.md and docs/ in the Motor repository; `motor --help` for the operator CLI."
