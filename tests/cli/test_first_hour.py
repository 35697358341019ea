"""An operator's first hour, row by row (issue 20): every mistake gets one clear sentence and the
right exit code, and nothing is left running.

Everything runs as a user would run it: the installed console scripts as real processes, in a
temporary directory. ``no_process_left`` checks by session (each program is started in its own
session, as a terminal would) and by command line (anything naming the temporary directory).
"""

from __future__ import annotations

import json
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


def run(argv: list[str], cwd: Path, timeout: float = 60, env: dict[str, str] | None = None, *,
        fleet_running: bool = False) -> subprocess.CompletedProcess[str]:
    """Run a console script in its own session, like a shell would; assert it left nothing behind
    (nothing in its session; nothing naming *cwd* either, unless a fleet there is meant to run)."""
    proc = subprocess.Popen([tool(argv[0]), *argv[1:]], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ, **(env or {})})
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(5)
    assert no_process_left(proc.pid, Path("/nonexistent") if fleet_running else cwd) == []
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


@pytest.mark.parametrize("argv", [[s] for s in SCRIPTS] + [["motor", c] for c in ("up", "down", "status", "register", "pause", "resume")]
                         + [["motor", "register", a] for a in ("add", "set", "del", "list")]
                         + [["motor-sim", "vllm", "serve"], ["motor-sim", "sglang"]],
                         ids=" ".join)
def test_help_is_written_for_the_terminal(argv: list[str], tmp_path: Path) -> None:
    text = help_of(argv, tmp_path)
    assert "``" not in text, "RST markup leaks into --help"
    assert not re.search(r"SPEC\s*§", text), "--help cites a document that is not shipped"
    assert len(text.strip().splitlines()) >= 8, text
    if argv[:2] == ["motor", "register"] and len(argv) == 3:
        assert f"motor register {argv[2]} " in text.split("options:")[0], "no example invocation"


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


# -- motor up --------------------------------------------------------------------------------------

TYPOS = """\
coordinator:
  schedular: {policy: round_robin}
controller:
  heartbeat_timeout: 3
gateway:
  coordinater: [127.0.0.1:9100]
nodemanager:
  engin: {launcher: simulator}
"""


def test_dry_run_checks_every_section_with_the_programs_own_loaders(tmp_path: Path) -> None:
    (tmp_path / "typo.yaml").write_text(TYPOS)
    done = run(["motor", "up", "--config", "typo.yaml", "--dry-run"], tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    expected = [
        ("coordinator.schedular", "scheduler"), ("controller.heartbeat_timeout", "heartbeat_timeout_sec"),
        ("gateway.coordinater", "coordinators"), ("nodemanager.engin", "engine"),
    ]
    for key, suggestion in expected:
        assert any(line.startswith(f"error: typo.yaml: unknown configuration key '{key}' (did you mean "
                                   f"'{suggestion}'?)") for line in errors), (key, done.stderr)
    assert len(errors) == 4, done.stderr  # two nodemanagers, one line
    assert not (tmp_path / ".motor").exists()  # a dry run writes nothing

    (tmp_path / "good.yaml").write_text("coordinator:\n  scheduler: {policy: round_robin}\n")
    ok = run(["motor", "up", "--config", "good.yaml", "--dry-run"], tmp_path, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "# every program accepted its configuration (5 checked with --check-config)" in ok.stdout


def test_a_fleet_section_that_is_not_a_mapping_is_one_sentence_and_an_empty_one_is_no_override(
    tmp_path: Path,
) -> None:
    for body, kind in (("coordinator: 5\n", "int"), ("gateway: [127.0.0.1:9100]\n", "list")):
        (tmp_path / "bad.yaml").write_text(body)
        done = run(["motor", "up", "--config", "bad.yaml", "--dry-run"], tmp_path)
        section = body.split(":")[0]
        assert (done.returncode, done.stderr) == (
            2, f"error: fleet config section {section} must be a mapping of {section} settings, got {kind}\n")
    (tmp_path / "empty.yaml").write_text("coordinator:\n  # scheduler: {policy: round_robin}\n")
    ok = run(["motor", "up", "--config", "empty.yaml", "--dry-run"], tmp_path, timeout=120)
    assert ok.returncode == 0, ok.stderr  # was an AttributeError traceback, like the two above


@pytest.mark.slow
def test_a_program_that_rejects_its_configuration_is_not_restarted(tmp_path: Path) -> None:
    (tmp_path / "typo.yaml").write_text("coordinator:\n  schedular: {policy: round_robin}\n")
    done = run(["motor", "up", "--config", "typo.yaml", "--restart-delay", "0.2", "--timeout", "60"], tmp_path,
               timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith(
        "error: typo.yaml: unknown configuration key 'coordinator.schedular' (did you mean 'scheduler'?)"), lines
    assert lines[1] == ("motor up stopped: the coordinator cannot start as configured (exit 2) and is not restarted; "
                        "fix typo.yaml and run motor up again (log: .motor/up/logs/coordinator.log)")
    log = (tmp_path / ".motor/up/logs/coordinator.log").read_text()
    assert log.count("unknown configuration key") == 1  # started once, never restarted
    assert "Stopped; no process left running." in done.stdout
    assert not (tmp_path / ".motor/up/fleet.json").exists()


def test_an_older_state_dir_is_refused_with_what_to_do(tmp_path: Path) -> None:
    state = tmp_path / ".motor/up"
    state.mkdir(parents=True)
    (state / "controller.db").write_bytes(b"old store")
    done = run(["motor", "up"], tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: state dir .motor/up was written by an older Motor (it has controller.db but no state-format; its "
        "store may hold instance ids this version no longer uses): remove it (rm -rf .motor/up: it holds only "
        "this local fleet's configs, logs, key and store) or pass another --state-dir")
    assert (state / "controller.db").read_bytes() == b"old store"  # refused: nothing touched
    (state / "state-format").write_text("99\n")
    newer = run(["motor", "up"], tmp_path)
    assert newer.returncode == 2 and "written by a newer Motor (state format 99" in newer.stderr


@pytest.mark.parametrize("argv,flag", [(["motor", "down"], "--state-dir DIR"),
                                       (["motor", "status"], "--controller ADDR")])
def test_down_and_status_when_nothing_runs_say_so(argv: list[str], flag: str, tmp_path: Path) -> None:
    done = run(argv, tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().endswith(
        f"no fleet is running in .motor/up (no fleet.json); start one with `motor up`, or pass {flag}")
    # a fleet file left by a motor up that was SIGKILLed: said as such
    state = tmp_path / ".motor/up"
    state.mkdir(parents=True, exist_ok=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (state / "fleet.json").write_text(f'{{"pid": {dead.pid}, "controller": "127.0.0.1:1"}}')
    stale = run(argv, tmp_path)
    assert stale.returncode == 1
    assert f"the `motor up` (pid {dead.pid}) that wrote .motor/up/fleet.json is no longer running" in stale.stderr


def test_down_never_signals_a_process_that_was_given_a_dead_motor_ups_pid(tmp_path: Path) -> None:
    """fleet.json of a motor up that was SIGKILLed (its pid reused since): the pid runs, but it is
    another process (its start time differs), which motor down must not stop."""
    state = tmp_path / ".motor/up"
    state.mkdir(parents=True)
    other = subprocess.Popen(["sleep", "60"])
    try:
        started = psutil.Process(other.pid).create_time()
        (state / "fleet.json").write_text(json.dumps({"pid": other.pid, "started": started - 3600.0}))
        done = run(["motor", "down", "--timeout", "1"], tmp_path)
        assert done.returncode == 1 and "nothing to stop" in done.stderr
        assert other.poll() is None  # still running: not signalled
    finally:
        other.kill()
        other.wait()


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def alive(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid} {' '.join(p.cmdline())}")
        except psutil.Error:
            continue
    return out


def ready_reason(url: str) -> tuple[int, str]:
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/ready", timeout=5) as resp:
            return resp.status, str(json.loads(resp.read()).get("reason", ""))
    except urllib.error.HTTPError as exc:
        return exc.code, str(json.loads(exc.read()).get("reason", ""))


@pytest.mark.slow
async def test_one_fleet_per_state_dir_one_key_lookup_exact_ids_and_the_gateways_reason(tmp_path: Path) -> None:
    import orjson

    from tests.helpers import wait_for
    from tests.motor_up import motor_up

    async with motor_up(tmp_path, "--zero-latency", "--restart-delay", "60") as fleet:
        info = fleet.info
        state = str(fleet.state)
        # a second motor up on the same state dir says the first is running, and where
        second = run(["motor", "up", "--state-dir", state], tmp_path, fleet_running=True)
        assert second.returncode == 1
        assert second.stderr.strip() == (
            f"error: a fleet is already running in {state} (motor up pid {fleet.proc.pid}, gateway "
            f"{info['gateway_url']}); stop it with `motor down --state-dir {state}` (or Ctrl-C in its terminal), "
            f"or pass another --state-dir")

        # motor register finds motor up's coordinator and key like motor status does; one vocabulary
        listed = run(["motor", "register", "list", "--json", "--state-dir", state], tmp_path, fleet_running=True)
        assert listed.returncode == 0, listed.stderr
        registered = orjson.loads(listed.stdout)["instances"]
        status = run(["motor", "status", "--json", "--state-dir", state], tmp_path, fleet_running=True)
        assert status.returncode == 0, status.stderr
        managed = orjson.loads(status.stdout)["instances"]
        assert {i["id"] for i in registered} == {i["id"] for i in managed} and len(managed) == 2
        assert {i["job"] for i in registered} == {i["job"] for i in managed}
        assert all("job_name" not in i for i in registered)
        # ids are exact in JSON: at most 2^53 - 1, the same digits any JSON reader (a double) sees
        for doc in (listed.stdout, status.stdout):
            for text in re.findall(r'"id": (\d+)', doc):
                assert int(text) <= 2**53 - 1 and int(float(text)) == int(text)

        # the gateway not ready: motor up shows the gateway's own reason (its /ready body), not "?"
        os.kill(info["programs"]["coordinator"]["pid"], 9)
        seen: set[str] = set()  # every reason the gateway gave while we watched

        def shown_by_motor_up() -> list[str]:
            code, reason = ready_reason(info["gateway_url"])
            if code == 503:
                seen.add(reason)
            shown = re.findall(r"gateway NOT ready: (.*)$", fleet.log.read_text(), re.M)
            return [r for r in shown if r in seen]

        try:
            shown = await wait_for(shown_by_motor_up, timeout=30, what="motor up showing the gateway's reason")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; the gateway said {seen}\n{fleet.diagnostics()}") from None
        assert all(r and r != "?" for r in shown)

        # motor down stops it all
        children = descendants(fleet.proc.pid)
        down = run(["motor", "down", "--state-dir", state], tmp_path, fleet_running=True)
        assert (down.returncode, down.stdout.strip()) == (0, "stopped"), down.stderr
        assert fleet.proc.wait(30) == 0
        await wait_for(lambda: not alive(children), timeout=15, what="every program of the fleet gone")
        again = run(["motor", "down", "--state-dir", state], tmp_path)
        assert again.returncode == 1 and "nothing to stop" in again.stderr


@pytest.mark.slow
async def test_ctrl_c_during_start_up_leaves_nothing_behind(tmp_path: Path) -> None:
    import signal

    from tests.helpers import wait_for

    out = tmp_path / "up.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen([tool("motor"), "up", "--port", "0"], cwd=tmp_path, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        await wait_for(lambda: "started gateway" in out.read_text(), timeout=60, what="motor up starting")
        children = descendants(proc.pid)
        assert len(children) >= 5
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(10)
    text = out.read_text()
    assert "Motor is up" not in text and text.rstrip().endswith("Stopped; no process left running.")
    assert alive(children) == []
    assert no_process_left(proc.pid, tmp_path) == []
    assert not (tmp_path / ".motor/up/fleet.json").exists()


def test_motor_up_on_a_busy_gateway_port_says_so(busy_port: int, tmp_path: Path) -> None:
    done = run(["motor", "up", "--port", str(busy_port)], tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"error: gateway port {busy_port} is in use (by pid {os.getpid()}, "
                                   f"{psutil.Process().name()}); pass another --port or free it")
    assert not (tmp_path / ".motor").exists()
