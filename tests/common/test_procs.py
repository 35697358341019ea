"""Children wrapped with die_with_parent are signalled when their parent dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import psutil

from motor_common.procs import die_with_parent
from tests.helpers import wait_for


async def test_grandchild_dies_when_its_parent_is_killed(tmp_path: object) -> None:
    # The middle process spawns a sleeper through the shim, prints its pid, then waits forever.
    middle = textwrap.dedent(
        """
        import subprocess, sys, time
        from motor_common.procs import die_with_parent
        child = subprocess.Popen(die_with_parent([sys.executable, "-c", "import time; time.sleep(600)"]),
                                 start_new_session=True)
        print(child.pid, flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", middle], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    await wait_for(lambda: psutil.Process(grandchild).cmdline()[-1] == "import time; time.sleep(600)",
                   timeout=10, what="shim exec'd the real program")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    await wait_for(lambda: not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE,
                   timeout=10, what="grandchild gone")


def test_the_shim_execs_the_program_with_its_arguments() -> None:
    out = subprocess.run(die_with_parent([sys.executable, "-c", "import sys; print(sys.argv[1:])", "a", "b c"]),
                         capture_output=True, text=True, timeout=20, check=True)
    assert out.stdout.strip() == "['a', 'b c']"
