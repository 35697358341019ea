"""How tests/clients builds each client in clients/ from the current sources, so that a test never
runs a client older than what it is made from (scripts/setup --tools builds some of them too, but a
source may have changed since).

- Go (clients/go/generate.sh: protoc, then `go build`) is built every time: go compares content
  hashes itself (about a second when nothing changed), so a binary copied in or built from other
  stubs is replaced even when its file is newer than every source.
- TypeScript (tsc), Connect-ES (buf generate + tsc), Java (protoc + javac) and C++ (protoc + g++)
  are built when the built client is missing or older than a source: the client's own files, and
  for the generated ones protos/ and third_party/ (proto-loader reads protos/ at run time).
"""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ROOT / "clients"
CONNECT = CLIENTS / "ts-connect"
GENERATED_FROM = (ROOT / "protos", ROOT / "third_party")


@dataclass(frozen=True)
class Client:
    """How one client in clients/ is built, and from what."""

    home: Path  # clients/<lang>
    build: list[str]  # generates and builds it, run in `home`
    programs: list[str]  # what the build and the run need on PATH ...
    files: list[str]  # ... and on disk (globs); scripts/setup --tools installs both
    built: Path  # what the test runs
    sources: tuple[Path, ...] | None  # the build is skipped when none is newer than `built`; None: always built
    optional: bool  # a missing toolchain skips the tests outside CI (CI=true fails)


GOCODE = "/usr/share/gocode/src/google.golang.org"  # Debian's Go sources, used in GOPATH mode
CLIENT = {  # in the order tests/clients builds them: the quick ones first
    "go": Client(home=CLIENTS / "go", build=["./generate.sh"],
                 programs=["go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc"],
                 files=[f"{GOCODE}/grpc", f"{GOCODE}/genproto", f"{GOCODE}/protobuf"],
                 built=CLIENTS / "go" / "motor-client", sources=None, optional=False),
    # proto-loader reads protos/ at run time: only the client's own files are compiled
    "ts": Client(home=CLIENTS / "ts", build=["node_modules/.bin/tsc"], programs=["node"],
                 files=[str(CLIENTS / "ts" / "node_modules" / ".bin" / "tsc")],
                 built=CLIENTS / "ts" / "dist" / "client.js", sources=(CLIENTS / "ts",), optional=False),
    "ts-connect": Client(home=CONNECT, build=["npm", "run", "build"], programs=["node", "npm"],
                         files=[str(CONNECT / "node_modules" / ".bin" / tool)
                                for tool in ("buf", "protoc-gen-es", "tsc")],
                         built=CONNECT / "dist" / "client.js", sources=(*GENERATED_FROM, CONNECT), optional=True),
    "java": Client(home=CLIENTS / "java", build=["./generate.sh"],
                   programs=["protoc", "grpc_java_plugin", "javac", "java"],
                   files=["/usr/share/java/grpc-core.jar", "/usr/share/java/netty-codec-http2.jar",
                          "/usr/share/java/geronimo-annotation-1.3-spec.jar", "/usr/share/java/netty-tcnative.jar",
                          "/usr/lib/*/jni/libnetty-tcnative.so"],
                   built=CLIENTS / "java" / "motor-client", sources=(*GENERATED_FROM, CLIENTS / "java"),
                   optional=True),
    "cpp": Client(home=CLIENTS / "cpp", build=["./generate.sh"],
                  programs=["protoc", "grpc_cpp_plugin", "g++", "pkg-config"], files=["/usr/include/grpcpp/grpcpp.h"],
                  built=CLIENTS / "cpp" / "motor-client", sources=(*GENERATED_FROM, CLIENTS / "cpp"), optional=True),
}
# In a client's own directory: its outputs and installed packages, not its sources.
NOT_SOURCES = {"gen", "build", "dist", "node_modules", ".gopath", ".gocache"}


def missing_tools(lang: str) -> list[str]:
    client = CLIENT[lang]
    return [p for p in client.programs if shutil.which(p) is None] + [f for f in client.files if not glob.glob(f)]


def stale(client: Client) -> bool:
    """The built client is missing or older than one of the files it is made from (or is always built)."""
    if client.sources is None or not client.built.exists():
        return True
    made = client.built.stat().st_mtime
    for top in client.sources:
        for folder, dirs, files in os.walk(top):
            if Path(folder) == client.home:
                dirs[:] = [d for d in dirs if d not in NOT_SOURCES]
            if any(os.stat(os.path.join(folder, f)).st_mtime > made for f in files):
                return True
    return False


async def build(lang: str) -> str:
    """'' when the client is built, else why not (a missing toolchain, or the build's output)."""
    missing = missing_tools(lang)
    if missing:
        return f"no {lang} toolchain ({', '.join(missing)}): run scripts/setup --tools"
    client = CLIENT[lang]
    if not stale(client):
        return ""
    argv = client.build
    command = " ".join(argv)
    proc = await asyncio.create_subprocess_exec(*argv, cwd=client.home, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=600)
    except TimeoutError:
        return f"clients/{lang}: {command} took more than 600 s"
    finally:
        if proc.returncode is None:  # timed out, or the module ended first: the compilers too
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    return "" if proc.returncode == 0 else \
        f"clients/{lang}: {command} failed ({proc.returncode}):\n{out.decode(errors='replace')}"
