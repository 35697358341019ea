"""bench/mypyc_build.py's inputs stay true to the tree: every module it compiles exists and is
strictly typed source of ours, and every scratch-copy patch it makes still finds its text exactly
once. The compilation itself (≈ 1.5-2.5 min of gcc) is a benchmark step, not run here."""

from __future__ import annotations

import importlib.util

import pytest

from bench.mypyc_build import HOT_PATH, PACKAGES, PATCHES, module_path


def test_every_hot_path_module_is_a_source_file_of_ours() -> None:
    assert len(set(HOT_PATH)) == len(HOT_PATH)
    for module in HOT_PATH:
        path = module_path(module)
        assert path.is_file(), module
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None
        assert spec.origin.endswith(".py"), f"{module} is already compiled in this venv: {spec.origin}"


def test_patches_find_their_text_once() -> None:
    for module, old, new in PATCHES:
        assert module in HOT_PATH
        text = module_path(module).read_text()
        assert text.count(old) == 1, (module, old)
        assert old != new


def test_unknown_package_is_refused() -> None:
    with pytest.raises(ValueError, match="not in"):
        module_path("json.decoder")
    assert set(PACKAGES) == {"motor_common", "motor_coordinator", "motor_gateway"}
