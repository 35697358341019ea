"""Spawning child processes that never outlive their parent.

Every long-lived child Motor starts (engines under a nodemanager, the fleet under ``motor up``)
gets its own session (so its whole process group can be signalled) and the Linux parent-death
signal, so a parent killed with SIGKILL still takes its children down and no orphan keeps a port.

``preexec_fn`` is unsafe in a process with threads (gRPC has some), so the death signal is set by a
tiny exec shim instead: ``python -c <shim> <parent pid> argv…`` sets ``PR_SET_PDEATHSIG``, checks
the parent is still the one it expects (closing the race), then ``execvp``s the real program.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

_SHIM = (
    "import ctypes,os,signal,sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(sys.argv[1]))\n"
    "os.getppid() == int(sys.argv[2]) or os._exit(1)\n"
    "os.execvp(sys.argv[3], sys.argv[3:])\n"
)


def die_with_parent(argv: Sequence[str], *, signal_number: int = 15) -> list[str]:
    """*argv* wrapped so the process receives *signal_number* when this process dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-c", _SHIM, str(signal_number), str(os.getpid()), *argv]
