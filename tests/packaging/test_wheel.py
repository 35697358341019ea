"""Installing Motor without a clone: build the wheel, install it into a fresh venv, run it there.

Kept fast and offline: the wheel is built with the project venv's own build backend
(``--no-isolation``) from a copy of the sources, and installed with ``--no-deps`` into a fresh venv
that sees the project venv's site-packages for the *dependencies* only (a path appended after the
new venv's own site-packages; the project's editable install is a ``.pth`` hook there, which a
plain path entry does not run). Every import of Motor in the fresh venv therefore comes from the
wheel, which the test checks. CI also builds sdist + wheel with an isolated ``python -m build``
(scripts/test).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def sh(argv: list[str], cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    files = sh(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT).stdout
    for name in filter(None, files.split("\0")):
        source = ROOT / name
        if source.is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes(source.read_bytes())
    out = tmp_path_factory.mktemp("dist")
    built = sh([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(src)])
    noise = [line for line in (built.stdout + built.stderr).splitlines()
             if "Deprecat" in line or "BuildBackendWarning" in line or ("license" in line.lower() and "warn" in line.lower())]
    assert noise == [], "the build is not quiet:\n" + "\n".join(noise)
    (whl,) = out.glob("motor_pd-*.whl")
    return whl


def test_the_wheel_carries_the_license_and_the_package_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    packages = ["motor_common", "motor_sim", "motor_controller", "motor_coordinator", "motor_nodemanager",
                "motor_gateway", "motor_cli"]
    for package in packages:
        assert f"{package}/py.typed" in names, package
    for area in ("common", "controller", "coordinator", "nodemanager"):
        stub = f"motor_common/gen/motor/{area}/v1/{'types' if area == 'common' else area}_pb2"
        assert {f"{stub}.py", f"{stub}.pyi"} <= names, stub
    # every non-Python file of the packages' source trees is in the wheel
    for package_dir in (ROOT / "common", ROOT / "simulator", ROOT / "cli", ROOT / "gateway", ROOT / "services"):
        for path in package_dir.rglob("*"):
            if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts \
                    and "egg-info" not in str(path):
                rel = next(str(path.relative_to(base)) for base in (
                    ROOT / "common", ROOT / "simulator", ROOT / "cli", ROOT / "gateway",
                    ROOT / "services/controller", ROOT / "services/coordinator", ROOT / "services/nodemanager")
                    if path.is_relative_to(base))
                assert rel in names, f"{rel} is not packaged"


def test_a_fresh_venv_gets_every_console_script_from_the_wheel(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    sh([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    sh([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)])
    # the dependencies from the project venv, as a plain path (its .pth hooks do not run)
    site = Path(sh([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "motor-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    where = sh([str(py), "-c", "import motor_cli, motor_common.gen.motor.common.v1.types_pb2 as t; "
                              "print(motor_cli.__file__); print(t.__file__)"]).stdout.split()
    assert all(path.startswith(str(venv)) for path in where), where

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for name in scripts:
        done = sh([str(venv / "bin" / name), "--help"])
        assert done.stdout.strip(), name
    motor = sh([str(venv / "bin" / "motor"), "--help"]).stdout
    assert "motor up" in motor and "Docs:" in motor
    sim = sh([str(venv / "bin" / "motor-sim"), "--help"]).stdout
    assert len(sim.splitlines()) > 5 and "motor-sim vllm serve" in sim
    # the programs find each other next to the installed motor: a dry run checks all of them
    dry = sh([str(venv / "bin" / "motor"), "up", "--dry-run"], cwd=tmp_path)
    assert f"# coordinator: {venv}/bin/motor-coordinator" in dry.stdout
    assert "every program accepted its configuration (5 checked" in dry.stdout
