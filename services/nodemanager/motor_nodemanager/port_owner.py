"""Which process serves an engine's port (Linux ``/proc``).

Any program can answer ``GET /health`` with 200: another server that was handed the engine's planned
port (the engine then exits "address already in use") looked healthy, and the requests routed to it
failed with 404. So once an engine answers, the poller checks that the listening socket on its port
belongs to the launched process or one of its descendants (vLLM, SGLang and the simulator all listen
in the process they were started as, or in a child it spawned): the TCP listeners on the port in the
engine's network namespace (``/proc/<pid>/net/tcp``, ``tcp6``) against the socket inodes among the
open files of the engine's process tree (``/proc/<pid>/fd``). Blocking file reads: call it off the
event loop.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

import psutil  # type: ignore[import-untyped]

LISTEN = "0A"  # TCP state in /proc/net/tcp


@dataclass(frozen=True)
class Listener:
    address: str  # "0.0.0.0", "::", "127.0.0.1", ...
    inode: int


@dataclass(frozen=True)
class Ownership:
    owned: bool | None  # None: cannot tell (no /proc): the caller trusts /health
    detail: str = ""


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    # the kernel prints each 32-bit word in host (little-endian) order
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def parse_listeners(text: str, port: int) -> list[Listener]:
    """The listening sockets on *port* in one ``/proc/net/tcp`` or ``tcp6`` table."""
    out: list[Listener] = []
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 10 or f[3] != LISTEN:
            continue
        addr, _, hex_port = f[1].partition(":")
        if int(hex_port, 16) == port:
            out.append(Listener(_address(addr), int(f[9])))
    return out


def relevant(listeners: list[Listener], ip: str) -> list[Listener]:
    """The listeners a connection to *ip* can reach: one bound to *ip* itself wins over a wildcard."""
    try:
        ipaddress.ip_address(ip)
    except ValueError:  # a host name: every listener on the port counts
        return listeners
    exact = [x for x in listeners if x.address == ip]
    return exact or [x for x in listeners if x.address in ("0.0.0.0", "::")]


def _socket_inodes(pid: int, proc: str) -> set[int]:
    out: set[int] = set()
    try:
        names = os.listdir(f"{proc}/{pid}/fd")
    except OSError:  # gone, or not ours to read
        return out
    for name in names:
        try:
            link = os.readlink(f"{proc}/{pid}/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(int(link[8:-1]))
    return out


def _holder(inodes: set[int], proc: str) -> int | None:
    """A process holding one of *inodes* (a full scan of /proc, done only when the check failed)."""
    for entry in os.scandir(proc):
        if entry.name.isdigit() and _socket_inodes(int(entry.name), proc) & inodes:
            return int(entry.name)
    return None


def _tree(pid: int) -> list[int]:
    root = psutil.Process(pid)
    return [pid, *(c.pid for c in root.children(recursive=True))]


def check(pid: int, ip: str, port: int, proc: str = "/proc") -> Ownership:
    """Whether the socket a connection to *ip*:*port* reaches is the engine's (process *pid*, 0 when
    it is not running, or a descendant). Blocking: run it in a thread."""
    if not os.path.isdir(f"{proc}/self/net"):
        return Ownership(None, "no /proc to check which process serves the port")
    gone = Ownership(False, f"port {port} answers, but the engine process (pid {pid}) is not running")
    if pid <= 0:
        return gone
    listeners: list[Listener] = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/{pid}/net/{table}") as f:
                listeners += parse_listeners(f.read(), port)
        except FileNotFoundError:
            if not os.path.isdir(f"{proc}/{pid}"):
                return gone
            continue  # no IPv6 in this kernel
        except OSError:
            return gone
    serving = relevant(listeners, ip)
    if not serving:
        return Ownership(False, f"nothing listens on port {port} (the engine pid {pid} has not bound it)")
    try:
        tree = _tree(pid)
    except psutil.Error:
        return gone
    engine = set[int]().union(*(_socket_inodes(p, proc) for p in tree))
    foreign = {x.inode for x in serving} - engine
    if not foreign:
        return Ownership(True)
    holder = _holder(foreign, proc)
    who = f"pid {holder}" if holder is not None else "pid unknown"
    return Ownership(False, f"port {port} is served by another process ({who}), not by the engine (pid {pid})")
