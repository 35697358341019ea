"""The package layering (CONTRIBUTING.md): shared code lives in ``motor_common`` and imports no
program's package; a program imports ``motor_common`` and its own package, never another
program's (the co-located front of the coordinator uses ``motor_common.openai_front``, not
``motor_gateway``). Read from the sources' import statements (no import side effects)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "motor_common": ROOT / "common" / "motor_common",
    "motor_sim": ROOT / "simulator" / "motor_sim",
    "motor_controller": ROOT / "services" / "controller" / "motor_controller",
    "motor_coordinator": ROOT / "services" / "coordinator" / "motor_coordinator",
    "motor_nodemanager": ROOT / "services" / "nodemanager" / "motor_nodemanager",
    "motor_gateway": ROOT / "gateway" / "motor_gateway",
}
# The CLI starts and drives every program (``motor up``), so it may import them all.
ALLOWED = {name: {"motor_common", name} for name in PACKAGES}


def imported_packages(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return {name for name in out if name in PACKAGES}


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_a_package_imports_only_motor_common_and_itself(package: str) -> None:
    files = [p for p in PACKAGES[package].rglob("*.py") if "gen" not in p.relative_to(PACKAGES[package]).parts]
    assert files, package
    wrong = {f"{p.relative_to(ROOT)}: {sorted(imported_packages(p) - ALLOWED[package])}"
             for p in files if imported_packages(p) - ALLOWED[package]}
    assert not wrong, wrong


def test_the_openai_front_is_shared_by_the_gateway_and_the_coordinator() -> None:
    users = {name for name, root in PACKAGES.items() if name != "motor_common"
             for p in root.rglob("*.py") if "motor_common.openai_front" in p.read_text()}
    assert {"motor_gateway", "motor_coordinator"} <= users
