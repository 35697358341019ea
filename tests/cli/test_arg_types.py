"""Numbers on the `motor` command lines: out of range is argparse's usage error naming the flag
(exit 2), never a traceback (`--port 70000`: OverflowError from bind) nor a silently odd run
(`--timeout nan`: a deadline that never comes; `--restart-delay nan`: never restarted)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import tool


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["up", "--dry-run", "--port", "70000"], "argument --port: port 70000 is outside 0-65535"),
        (["up", "--dry-run", "--port", "-1"], "argument --port: port -1 is outside 0-65535"),
        (
            ["up", "--dry-run", "--timeout", "nan"],
            "argument --timeout: nan seconds: give more than 0",
        ),
        (
            ["up", "--dry-run", "--restart-delay", "nan"],
            "argument --restart-delay: nan seconds: give at least 0",
        ),
        (
            ["up", "--dry-run", "--restart-delay", "-1"],
            "argument --restart-delay: -1 seconds: give at least 0",
        ),
        (
            ["down", "--timeout", "inf"],
            "argument --timeout: inf seconds: give more than 0 and at most 86400",
        ),
        (["pause", "1", "--timeout", "-1"], "argument --timeout: -1 seconds: give more than 0"),
        (["register", "list", "--timeout", "0"], "argument --timeout: 0 seconds: give more than 0"),
        (
            ["register", "list", "--timeout", "1e10"],
            "argument --timeout: 1e10 seconds: give more than 0",
        ),
    ],
)
def test_a_number_out_of_range_is_a_usage_error_naming_the_flag(
    tmp_path: Path, args: list[str], message: str
) -> None:
    run = subprocess.run(
        [tool("motor"), *args, "--state-dir", str(tmp_path / "up")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert message in run.stderr.splitlines()[-1], run.stderr
    assert "Traceback" not in run.stderr
