"""The installed Motor version, read from the package metadata, for every program's --version."""

from __future__ import annotations

import argparse
from importlib import metadata

DISTRIBUTION = "motor-pd"


def motor_version() -> str:
    """The version of the installed distribution ("unknown" when run from an uninstalled tree)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def version_line(prog: str) -> str:
    return f"{prog} {motor_version()} ({DISTRIBUTION})"


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    """`--version`: print "<prog> <version> (motor-pd)" and exit 0."""
    parser.add_argument("--version", action="version", version=version_line(parser.prog),
                        help="print the Motor version and exit")
