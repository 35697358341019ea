"""Proving that a stopped fleet left no process behind (Linux; elsewhere these are no-ops).

``motor up`` makes itself a *child subreaper*: a process whose parent dies (an engine whose
nodemanager was SIGKILLed: kept running for the restarted nodemanager to adopt, or with adoption off
one that ignored the parent-death SIGTERM) is re-parented to ``motor up``
instead of init, so it stays one of its descendants. On stop, after every program had its grace,
:func:`kill_leftovers` SIGKILLs the process group of every descendant still running, reaps them and
reports what it had to kill — ``motor up`` says "no process left running" only when none is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Collection

import psutil  # type: ignore[import-untyped]  # no stubs shipped

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphaned descendants are re-parented to this process (Linux ≥ 3.4); False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    return bool(ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def reap_adopted(tracked: Collection[int]) -> None:
    """Reap exited direct children this process did not spawn itself (adopted orphans); children in
    *tracked* are left to their ``Popen`` object (which needs their exit status)."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children():
            if child.pid in tracked:
                continue
            with contextlib.suppress(psutil.Error, ChildProcessError):
                if child.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(child.pid, os.WNOHANG)


def running_descendants() -> list[psutil.Process]:
    out = []
    with contextlib.suppress(psutil.Error):
        for p in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
    return out


def _describe(p: psutil.Process) -> str:
    try:
        return f"pid {p.pid} ({' '.join(p.cmdline())[:120]})"
    except psutil.Error:
        return f"pid {p.pid}"


async def kill_leftovers(tracked: Collection[int], timeout: float = 5.0) -> tuple[list[str], list[str]]:
    """SIGKILL the process group of every descendant still running; returns (what was killed, what
    is still running after *timeout*)."""
    left = running_descendants()
    killed = [_describe(p) for p in left]
    own = os.getpgrp()
    for p in left:
        with contextlib.suppress(ProcessLookupError, PermissionError, psutil.Error):
            pgid = os.getpgid(p.pid)
            if pgid != own:
                os.killpg(pgid, signal.SIGKILL)
            else:
                p.kill()
    deadline = time.monotonic() + timeout
    while True:
        reap_adopted(tracked)
        still = running_descendants()
        if not still or time.monotonic() >= deadline:
            return killed, [_describe(p) for p in still]
        await asyncio.sleep(0.05)
