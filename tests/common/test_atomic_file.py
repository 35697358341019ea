"""motor_common.atomic_file.write_atomic: old content or new, never half; no temp file left."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from motor_common.atomic_file import write_atomic


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_writes_and_replaces_with_a_private_mode_unless_told(tmp_path: Path) -> None:
    p = tmp_path / "f.json"
    write_atomic(p, b'{"a": 1}')
    assert p.read_bytes() == b'{"a": 1}' and _mode(p) == 0o600
    write_atomic(p, "two\n", mode=0o644, durable=True)
    assert p.read_text() == "two\n" and _mode(p) == 0o644
    assert sorted(os.listdir(tmp_path)) == ["f.json"]


def test_a_symlink_at_the_path_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "state-format"
    link.symlink_to(victim)
    write_atomic(link, "2\n")
    assert not link.is_symlink() and link.read_text() == "2\n"
    assert victim.read_text() == "keep"


def test_a_failed_rename_leaves_the_target_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "busy"
    target.mkdir()
    (target / "inside").write_text("x")  # a non-empty directory cannot be replaced by a file
    with pytest.raises(OSError):
        write_atomic(target, b"new")
    assert sorted(os.listdir(tmp_path)) == ["busy"] and (target / "inside").read_text() == "x"
