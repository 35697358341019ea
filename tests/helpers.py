"""Test helpers: waiting on conditions, free ports, process management."""

from __future__ import annotations

import asyncio
import inspect
import os
import random
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

from motor_common.ports import pick_span, scan_free_port

T = TypeVar("T")

_port_lock = threading.Lock()
_port_pickers: dict[str, Callable[[], int]] = {}
PORT_STRIDE = 16  # room above each pick: programs derive ports from a given one (DP rank offsets)


def harness_span() -> tuple[int, int]:
    """The ports [low, high) this test process picks from: the span the nodemanager picks engine
    ports in (:func:`motor_common.ports.pick_span`, outside the kernel's ephemeral range), and under
    pytest-xdist (``PYTEST_XDIST_WORKER`` gwN of ``PYTEST_XDIST_WORKER_COUNT``) only the worker's own
    slice of it, so two workers never pick one port in the seconds before its program binds it."""
    lo, hi = pick_span()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if worker.startswith("gw") and worker[2:].isdigit() and count > 1:
        size = (hi - lo) // count
        i = int(worker[2:]) % count
        lo, hi = lo + i * size, lo + (i + 1) * size
    return lo, hi


def _port_picker(host: str) -> Callable[[], int]:
    lo, hi = harness_span()
    nxt = random.randrange(lo, max(lo + 1, hi - 1000))

    def pick() -> int:
        nonlocal nxt
        for start in (nxt, lo):  # past the span's top: ports handed out long ago are free again
            try:
                port = scan_free_port(host, start, count=max(1, hi - start))
            except OSError:
                continue
            if port < hi:
                nxt = port + PORT_STRIDE
                return port
        raise OSError(f"no free port in the test harness's span {lo}-{hi} on {host}")

    return pick


def free_port(host: str = "127.0.0.1") -> int:
    """A port for a server a test starts (often a subprocess that binds it seconds later).

    Picked outside the kernel's ephemeral range (:func:`harness_span`), so no port-0 server and no
    outgoing connection can be handed it before its program binds it, and from one picker per test
    process, so two picks never repeat - not even for servers started at once (``asyncio.gather``);
    under pytest-xdist each worker picks from a slice of its own. Picks lie :data:`PORT_STRIDE`
    apart, since engines derive ports from the one they are given (a DP rank's KV-event port is the
    base plus its rank). The kernel's own pick (``bind(0)``) could hand one port to two servers bound
    in between; a CI run lost a simulator to that ("address already in use")."""
    with _port_lock:
        pick = _port_pickers.get(host)
        if pick is None:
            pick = _port_pickers[host] = _port_picker(host)
        return pick()


@overload
async def wait_for(
    check: Callable[[], Awaitable[T]], *, timeout: float = ..., interval: float = ..., what: str = ...
) -> T: ...


@overload
async def wait_for(
    check: Callable[[], T], *, timeout: float = ..., interval: float = ..., what: str = ...
) -> T: ...


async def wait_for(
    check: Callable[[], Any],
    *,
    timeout: float = 10.0,
    interval: float = 0.05,
    what: str = "condition",
) -> Any:
    """Poll *check* (sync or async) until it returns a truthy value (exceptions count as falsy).

    On timeout the error names what the last poll saw: its falsy result or its exception."""
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        try:
            result = check()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return result
            last = f"last result: {result!r}"
        except Exception as exc:
            last = f"last error: {exc!r}"
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what} ({last})")
        await asyncio.sleep(interval)



def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


async def http_ok(url: str, path: str = "/ready") -> bool:
    """True when ``GET url+path`` answers 200 within 2 s (a wait_for condition for a front's
    readiness); a refused or slow connection is False."""
    import aiohttp

    try:
        async with aiohttp.ClientSession() as s, s.get(url + path, timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


class SurvivesOneCancel:
    """A task body that swallows its first cancellation and ends on the second, as a loop around
    Python 3.11's ``asyncio.wait_for`` does when the cancel arrives as the inner call completes.
    ``running`` is set once the body waits; ``swallowed`` counts the cancellations it ignored."""

    def __init__(self) -> None:
        self.running = asyncio.Event()
        self.swallowed = 0

    async def __call__(self) -> None:
        while True:
            try:
                self.running.set()
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                if self.swallowed:
                    raise
                self.swallowed += 1  # as wait_for did: the loop goes on


def varint(n: int) -> bytes:
    """*n* as a protobuf base-128 varint (hand-built wire bytes: unknown fields, length prefixes)."""
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)
