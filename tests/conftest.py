"""Shared fixtures and helpers for Motor's tests."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """Path of a console tool installed next to this interpreter (the venv), else on PATH."""
    local = BIN / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed: run scripts/setup")
    return found
