"""protoc generates every main language from protos/ with no per-language flags, thanks to the file
options: Go import paths, one Java class per message, C#/PHP/Ruby namespaces, ObjC prefixes, and
C++ accessors without keyword mangling."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROTOS = ROOT / "protos"
FILES = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))


def protoc(tmp_path: Path, *outs: str) -> Path:
    exe = shutil.which("protoc")
    if exe is None:
        pytest.fail("protoc is not installed: run scripts/setup --tools (Debian protobuf-compiler)")
    out = tmp_path / "out"
    out.mkdir()
    run = subprocess.run([exe, f"-I{PROTOS}", *[f"--{o}_out={out}" for o in outs], *FILES],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "warning" not in run.stderr.lower(), run.stderr
    return out


def test_java_gets_one_class_per_message_in_the_declared_package(tmp_path: Path) -> None:
    out = protoc(tmp_path, "java")
    java = out / "motor" / "coordinator" / "v1"
    assert (java / "InstanceSummary.java").exists() and (java / "CoordinatorProto.java").exists()
    text = (java / "InstanceSummary.java").read_text()
    assert text.startswith("// Generated") and "package motor.coordinator.v1;" in text
    assert "getUnionInstances()" in text


def test_cpp_csharp_php_ruby_objc_generate_with_the_declared_names(tmp_path: Path) -> None:
    out = protoc(tmp_path, "cpp", "csharp", "php", "ruby", "objc")
    header = (out / "motor" / "coordinator" / "v1" / "coordinator.pb.h").read_text()
    assert "union_instances() const" in header and "union_()" not in header
    assert "namespace Motor.Coordinator.V1" in (out / "Coordinator.cs").read_text()
    assert (out / "Motor" / "Coordinator" / "V1" / "InstanceSummary.php").exists()
    assert "module Motor\n  module Coordinator\n    module V1" in (
        out / "motor" / "coordinator" / "v1" / "coordinator_pb.rb").read_text()
    assert "@interface MCOInstanceSummary" in (out / "motor" / "coordinator" / "v1" / "Coordinator.pbobjc.h").read_text()


def test_go_import_paths_come_from_go_package(tmp_path: Path) -> None:
    if shutil.which("protoc-gen-go") is None:
        pytest.fail("protoc-gen-go is not installed: run scripts/setup --tools (Debian protoc-gen-go)")
    out = protoc(tmp_path, "go")
    generated = out / "motor" / "clients" / "go" / "gen" / "motor" / "controller" / "v1" / "controller.pb.go"
    text = generated.read_text()
    assert "package controllerv1" in text and '"motor/clients/go/gen/motor/common/v1"' in text


def test_check_generated_without_grpcio_tools_says_what_to_run() -> None:
    # -S: no site-packages, so this interpreter cannot import grpc_tools (a bare python3 without .venv)
    run = subprocess.run([sys.executable, "-S", str(ROOT / "scripts" / "gen_protos.py"), "--check"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert "has no grpcio-tools: run scripts/setup" in run.stderr
    assert "Traceback" not in run.stderr
