"""tests/clients/builds.py: a client is built from the current sources before a test runs it, so an
edit to a client, its generated stubs or protos/ without `scripts/setup --tools` never runs an old
build."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.clients.builds import CLIENT, CLIENTS, NOT_SOURCES, Client, build, stale


def _tree(tmp_path: Path) -> tuple[Client, Path, Path]:
    """A client in tmp_path/clients/x made from tmp_path/protos and its own directory; built, and
    older than nothing."""
    protos, home = tmp_path / "protos", tmp_path / "clients" / "x"
    (protos / "motor").mkdir(parents=True)
    (protos / "motor" / "a.proto").write_text("syntax = 'proto3';\n")
    for folder in ("src", *NOT_SOURCES):
        (home / folder).mkdir(parents=True)
    (home / "src" / "main.x").write_text("main\n")
    built = home / "dist" / "client"
    built.write_text("built\n")
    for path in (protos / "motor" / "a.proto", home / "src" / "main.x"):
        os.utime(path, (built.stat().st_mtime - 10,) * 2)
    client = Client(home=home, build=["true"], programs=[], files=[], built=built,
                    sources=(protos, home), optional=True)
    return client, protos, home


def _touch_newer(path: Path, than: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("changed\n")
    os.utime(path, (than.stat().st_mtime + 1,) * 2)


def test_a_built_client_newer_than_every_source_is_fresh(tmp_path: Path) -> None:
    client, _, _ = _tree(tmp_path)
    assert not stale(client)


@pytest.mark.parametrize("changed", ["protos/motor/a.proto", "protos/motor/new.proto", "clients/x/src/main.x",
                                     "clients/x/package-lock.json", "protos/gen/a.proto"])
def test_a_newer_source_makes_it_stale(tmp_path: Path, changed: str) -> None:
    client, _, _ = _tree(tmp_path)
    _touch_newer(tmp_path / changed, than=client.built)
    assert stale(client)


@pytest.mark.parametrize("output", sorted(NOT_SOURCES))
def test_its_outputs_and_packages_are_not_sources(tmp_path: Path, output: str) -> None:
    client, _, home = _tree(tmp_path)
    _touch_newer(home / output / "deep" / "file", than=client.built)
    assert not stale(client)


def test_a_missing_built_client_is_stale(tmp_path: Path) -> None:
    client, _, _ = _tree(tmp_path)
    client.built.unlink()
    assert stale(client)


def test_go_is_built_every_time() -> None:
    """A Go binary newer than every source may still be old (copied in, or built from other stubs):
    go build compares content itself, in about a second."""
    assert CLIENT["go"].sources is None and stale(CLIENT["go"])


def test_every_client_in_clients_is_built_by_the_tests() -> None:
    assert set(CLIENT) == {d.name for d in CLIENTS.iterdir() if d.is_dir()}
    for lang, client in CLIENT.items():
        assert client.home == CLIENTS / lang
        if client.build == ["./generate.sh"]:
            assert os.access(client.home / "generate.sh", os.X_OK), lang
        elif client.build[:2] == ["npm", "run"]:
            assert client.build[2] in json.loads((client.home / "package.json").read_text())["scripts"], lang
    assert not CLIENT["go"].optional and not CLIENT["ts"].optional  # the two the issue asks for never skip


@pytest.mark.slow
async def test_an_old_go_binary_is_replaced() -> None:
    """A motor-client that is not what the current sources build (here a script, newer than every
    source) is replaced by a real build before a test would run it."""
    binary = CLIENT["go"].built
    binary.write_text("#!/bin/sh\necho an old build >&2\nexit 3\n")
    assert await build("go") == ""
    assert binary.read_bytes()[:4] == b"\x7fELF"


@pytest.mark.slow
async def test_a_typescript_client_older_than_its_source_is_recompiled() -> None:
    client = CLIENT["ts"]
    assert await build("ts") == ""
    source = client.home / "client.ts"
    client.built.write_text("// an old build\n")
    os.utime(client.built, (source.stat().st_mtime - 10,) * 2)
    assert stale(client)
    assert await build("ts") == ""
    assert not stale(client) and "x-motor-management-key" in client.built.read_text()
