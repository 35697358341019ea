"""scripts/chaos-table: figures written by the suite become the table of docs/fault-tolerance.md."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from tests.chaos.scenario import Figures
from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "chaos-table"


def _figures(out: Path) -> None:
    ok = Figures("kill-prefill-engine", "`kill -9` a prefill engine", "fleet", requests=300, recovery_s=3.5, outage_s=0.2)
    ok.judge([])
    bad = Figures("kill-coordinator", "`kill -9` the only coordinator", "fleet", requests=900, failed=12,
                  failed_by_status={"503": 10, "0": 2}, recovery_s=None, not_ready_reason="no master",
                  exception="one coordinator | no redundancy")
    bad.judge(["something else"])
    for f in (ok, bad):
        (out / f"{f.scenario}.json").write_text(json.dumps(asdict(f)))


def test_renders_a_row_per_scenario_in_the_suite_order(tmp_path: Path) -> None:
    _figures(tmp_path)
    res = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    rows = [line for line in res.stdout.splitlines() if line.startswith("| `kill")]
    assert rows[0].startswith("| `kill -9` the only coordinator | 900 | 12 (no status: 2, 503: 10) |")
    assert rows[0].endswith("| **no**: not fully ready within 30 s (no master); 12 failed requests (at most 0); "
                            "something else |")
    assert rows[1] == "| `kill -9` a prefill engine | 300 | 0 | 0.2 s | 3.5 s | 0 | 0 | yes |"
    assert "- `kill -9` the only coordinator: one coordinator / no redundancy" in res.stdout  # no '|' in a note
    assert "Regenerate" in res.stdout


def test_write_replaces_only_the_marked_table(tmp_path: Path) -> None:
    _figures(tmp_path)
    doc = tmp_path / "doc.md"
    doc.write_text("before\n<!-- chaos-table:begin -->\nold table\n<!-- chaos-table:end -->\nafter\n")
    res = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--write", "--doc", str(doc)],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    text = doc.read_text()
    assert text.startswith("before\n<!-- chaos-table:begin -->\n| fault |") and text.endswith("<!-- chaos-table:end -->\nafter\n")
    assert "old table" not in text


def test_no_figures_is_a_clear_error(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "no figures in" in res.stderr and "MOTOR_CHAOS_RESULTS" in res.stderr
