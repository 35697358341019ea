"""An operator's first hour, row by row (issue 20): every mistake gets one clear sentence and the
right exit code, and nothing is left running.

Everything runs as a user would run it: the installed console scripts as real processes, in a
temporary directory. ``no_process_left`` checks by session (each program is started in its own
session, as a terminal would) and by command line (anything naming the temporary directory).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import tool
from tests.helpers import free_port

SCRIPTS = ["motor", "motor-controller", "motor-coordinator", "motor-nodemanager", "motor-gateway", "motor-sim"]


def run(argv: list[str], cwd: Path, timeout: float = 60, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    """Run a console script in its own session, like a shell would; assert it left nothing behind."""
    proc = subprocess.Popen([tool(argv[0]), *argv[1:]], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ, **(env or {})})
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(5)
    assert no_process_left(proc.pid, cwd) == []
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def no_process_left(session: int, directory: Path) -> list[str]:
    """Processes still in *session*, or whose command line names *directory* (empty = none)."""
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid == os.getpid():
                continue
            if os.getsid(p.pid) == session or str(directory) in " ".join(p.info["cmdline"] or ()):
                if p.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{p.pid} {' '.join(p.info['cmdline'] or ())}")
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return left


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port this test process listens on (so the holder's pid is known: ours)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", free_port()))
        s.listen()
        yield int(s.getsockname()[1])


NODE_CONFIG = """\
job_name: j
node_id: n
role: prefill
engine_type: vllm
model_name: tiny
ip: 127.0.0.1
controller_address: 127.0.0.1:1
engine: {launcher: simulator}
"""


def program_argv(program: str, port: int, tmp_path: Path) -> list[str]:
    if program == "motor-nodemanager":
        (tmp_path / "node.yaml").write_text(NODE_CONFIG)
        return [program, "--config", str(tmp_path / "node.yaml"), "--port", str(port)]
    if program == "motor-controller":
        (tmp_path / "controller.yaml").write_text(f"store: {{path: {tmp_path / 'c.db'}}}\n")
        return [program, "--config", str(tmp_path / "controller.yaml"), "--port", str(port)]
    return [program, "--port", str(port)]


@pytest.mark.parametrize("program", ["motor-controller", "motor-coordinator", "motor-nodemanager", "motor-gateway"])
def test_a_busy_port_is_one_sentence_and_exit_2(program: str, busy_port: int, tmp_path: Path) -> None:
    done = run(program_argv(program, busy_port, tmp_path), tmp_path)
    assert done.returncode == 2, done.stderr
    sentence = f"error: port {busy_port} is in use (by pid {os.getpid()}, {psutil.Process().name()}); pass --port or free it"
    assert sentence in done.stderr.splitlines()
    assert "Traceback" not in done.stderr and "RuntimeError" not in done.stderr
    assert "Unclosed" not in done.stderr


def test_a_busy_co_located_front_port_names_its_flag(busy_port: int, tmp_path: Path) -> None:
    done = run(["motor-coordinator", "--port", "0", "--http-port", str(busy_port)], tmp_path)
    assert done.returncode == 2
    assert f"port {busy_port} is in use (by pid {os.getpid()}" in done.stderr
    assert done.stderr.rstrip().endswith("pass --http-port or free it")
    assert "Traceback" not in done.stderr


# -- --help ----------------------------------------------------------------------------------------


def help_of(argv: list[str], tmp_path: Path) -> str:
    done = run([*argv, "--help"], tmp_path)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("argv", [[s] for s in SCRIPTS] + [["motor", c] for c in ("up", "down", "status", "register")]
                         + [["motor", "register", "add"], ["motor-sim", "vllm", "serve"], ["motor-sim", "sglang"]],
                         ids=" ".join)
def test_help_is_written_for_the_terminal(argv: list[str], tmp_path: Path) -> None:
    text = help_of(argv, tmp_path)
    assert "``" not in text, "RST markup leaks into --help"
    assert not re.search(r"SPEC\s*§", text), "--help cites a document that is not shipped"
    assert len(text.strip().splitlines()) >= 8, text


@pytest.mark.parametrize("script", SCRIPTS)
def test_top_level_help_says_what_how_and_where_the_docs_are(script: str, tmp_path: Path) -> None:
    text = help_of([script], tmp_path)
    lines = [line.strip() for line in text.splitlines()]
    assert any(line.startswith(script) and line != script and not line.startswith("usage") for line in lines), (
        f"{script} --help shows no example invocation:\n{text}")
    assert "docs/" in text or "README" in text, text


# -- --check-config --------------------------------------------------------------------------------


@pytest.mark.parametrize("program,section", [("motor-coordinator", "schedular: {policy: round_robin}"),
                                             ("motor-controller", "heartbeat_timeout: 3"),
                                             ("motor-gateway", "coordinater: [127.0.0.1:9100]")])
def test_check_config_names_the_key_and_the_suggestion(program: str, section: str, tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(section + "\n")
    done = run([program, "--config", str(cfg), "--check-config"], tmp_path)
    assert done.returncode == 2
    key = section.split(":")[0]
    assert re.search(rf"^error: {re.escape(str(cfg))}: unknown configuration key '{key}' \(did you mean '\w+'\?\)",
                     done.stderr, re.M), done.stderr
    cfg.write_text("{}\n")
    ok = run([program, "--config", str(cfg), "--check-config"], tmp_path)
    assert (ok.returncode, ok.stdout.strip()) == (0, "configuration OK"), ok.stderr
