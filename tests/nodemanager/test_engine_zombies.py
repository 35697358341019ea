"""A process group left with only zombies is gone: the stop of an engine does not wait for it.

Real zombies: a child of this process that exited and is not reaped yet; and the case of the
report, run in a child interpreter marked as a child subreaper (as PID 1 of a container without an
init is): the engine's leader crashes, its worker is re-parented to the "nodemanager" and exits,
and nothing reaps it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from motor_nodemanager.engines import _group_alive, group_running, parse_stat
from tests.helpers import wait_for

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")


def state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        parsed = parse_stat(f.read())
    assert parsed is not None
    return parsed[0]


def test_parse_stat_reads_past_a_command_name_with_spaces_and_parentheses() -> None:
    assert parse_stat("42 (vllm (x) y) Z 1 42 42 0 -1 4194560") == ("Z", 42)
    assert parse_stat("garbage") is None
    lines = ["7 (engine) Z 1 7 7", "8 (worker) S 1 7 7", "9 (other) R 1 9 9"]
    assert group_running(7, lines) is True
    assert group_running(7, lines[:1]) is False  # only a zombie left
    assert group_running(7, None) is None


async def test_a_group_whose_only_member_is_a_zombie_is_not_alive() -> None:
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    try:
        await wait_for(lambda: state(dead.pid) == "Z", timeout=10, what="an unreaped child (a zombie)")
        os.killpg(dead.pid, 0)  # the kernel still has the group: kill(…, 0) alone calls it alive
        assert _group_alive(dead.pid) is False
        assert _group_alive(live.pid) is True
    finally:
        live.kill()
        live.wait()
        dead.wait()


SUBREAPER_NODE = textwrap.dedent("""
    import asyncio, ctypes, logging, os, sys, time
    from motor_common.domain import Endpoint
    from motor_nodemanager.engines import EngineSupervisor, parse_stat
    from motor_nodemanager.launch import LaunchPlan

    assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER: like PID 1

    ENGINE = ("import os, sys, time\\n"
              "r, w = os.pipe()\\n"
              "if os.fork() == 0:\\n"                 # the worker: exits once its leader is gone
              "    os.close(w); os.read(r, 1); os._exit(0)\\n"
              "os._exit(139)\\n")                       # the leader crashes first

    def zombies():
        out = []
        for d in filter(str.isdigit, os.listdir("/proc")):
            try:
                text = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            fields = text.rpartition(")")[2].split()
            if fields[0] == "Z" and int(fields[1]) == os.getpid():
                out.append(int(d))
        return out

    async def main():
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)  # the stop's SIGKILL warning
        sup = EngineSupervisor()
        plan = LaunchPlan(Endpoint(0, "127.0.0.1", 1), 0, (sys.executable, "-c", ENGINE), dict(os.environ))
        sup._procs[0] = sup._spawn(plan, None)
        sup._tasks.spawn(sup._watch(sup._procs[0]))
        deadline = time.monotonic() + 20
        while not zombies():  # the adopted worker exited and nobody reaps it
            assert time.monotonic() < deadline, "no zombie appeared"
            await asyncio.sleep(0.05)
        await sup.stop_all(8.0)
        print(len(zombies()))

    asyncio.run(main())
""")


def test_stopping_an_engine_whose_adopted_worker_is_a_zombie_does_not_wait_the_stop_timeout() -> None:
    out = subprocess.run([sys.executable, "-c", SUBREAPER_NODE], capture_output=True, text=True, timeout=60,
                         env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)})  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) >= 1  # the worker is still a zombie: the stop did not depend on reaping it
    # the group counted as stopped once only the zombie was left: no wait for the stop timeout
    # and its SIGKILL (the warning a zombie-blind check logs after the whole 8 s)
    assert "still running after SIGTERM" not in out.stderr, out.stderr
