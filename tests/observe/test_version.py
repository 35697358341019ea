"""`--version` on every console script prints the installed distribution's version and exits 0."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])


def test_every_console_script_is_covered() -> None:
    assert SCRIPTS == ["motor", "motor-controller", "motor-coordinator", "motor-gateway",
                       "motor-nodemanager", "motor-sim"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_version_flag(script: str) -> None:
    exe = Path(sys.executable).parent / script
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    expected = metadata.version("motor-pd")
    assert out.stdout.strip() == f"{script} {expected} (motor-pd)"
    assert out.stderr == ""
