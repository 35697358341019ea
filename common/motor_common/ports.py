"""Ports: the programs' defaults, ``host:port`` text, and finding a free port."""

from __future__ import annotations

import errno
import random
import socket
from collections.abc import Callable

GATEWAY_HTTP = 8000
COORDINATOR_GRPC = 9100
CONTROLLER_GRPC = 9200
NODEMANAGER_GRPC = 9300


def host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 literal in brackets (``[::1]:9100``)."""
    host = host.strip("[]")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the kernel's pick; another process may take it later)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host.strip("[]"), 0))
        return int(s.getsockname()[1])


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ``bind(..., 0)`` and outgoing connections (Linux; else IANA's)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 49152, 65535


def scan_free_port(host: str, start: int, avoid: set[int] | frozenset[int] = frozenset(), count: int = 2000) -> int:
    """The first port from *start* up that can be bound now, is not in *avoid* and lies outside the
    kernel's ephemeral range — so no ``free_port()`` pick (an engine's, a test's) and no outgoing
    connection can take it between this choice and the program's own bind."""
    low, high = ephemeral_range()
    port, tried = start, 0
    while port < 65536 and tried < count:
        if low <= port <= high:
            port = high + 1
            continue
        if port not in avoid and port_free(host, port):
            return port
        port, tried = port + 1, tried + 1
    raise OSError(f"no free port on {host} from {start} up outside the kernel's ephemeral range {low}-{high}")


def pick_span() -> tuple[int, int]:
    """The ports [low, high) :func:`engine_port_picker` starts its scans in: from 10000 to 2000
    below the kernel's ephemeral range, or above that range when it starts too low for that."""
    low, high = ephemeral_range()
    return (10000, low - 2000) if low > 12000 else (high + 1, 63000)


def engine_port_picker(host: str, stride: int = 1) -> Callable[[], int]:
    """Successive free ports for engines a program plans now and launches later: scanned outside
    the kernel's ephemeral range (:func:`scan_free_port`) from a random start, so no other
    program's port-0 server (another nodemanager's ops endpoint on the same host) and no outgoing
    connection can be given one before its engine binds it. Picks lie at least *stride* apart
    (room for ports a program derives from the one it is given); past the top the scan starts
    again at 10000. Not thread-safe: callers on several threads hold a lock."""
    nxt = random.randrange(*pick_span())

    def pick() -> int:
        nonlocal nxt
        try:
            port = scan_free_port(host, nxt)
        except OSError:  # ran off the top: ports handed out long ago are free again
            port = scan_free_port(host, 10000)
        nxt = port + stride
        return port

    return pick


def port_free(host: str, port: int) -> bool:
    """Whether *port* on *host* can be bound now."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        try:
            s.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True


def listener_pid(port: int) -> tuple[int, str] | None:
    """(pid, process name) of the process listening on TCP *port*, when the OS lets us see it."""
    import psutil  # type: ignore[import-untyped]  # lazy: only needed when a bind fails

    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for conn in conns:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            try:
                return conn.pid, psutil.Process(conn.pid).name()
            except psutil.Error:
                return conn.pid, "?"
    return None


def port_in_use_message(port: int, hint: str = "pass --port or free it") -> str:
    """"port 9100 is in use (by pid 1234, motor-coordinator); pass --port or free it"."""
    who = listener_pid(port)
    by = f" (by pid {who[0]}, {who[1]})" if who else ""
    return f"port {port} is in use{by}; {hint}"


def bind_error(host: str, port: int) -> OSError | None:
    """Why *host*:*port* cannot be bound the way the servers bind it (SO_REUSEADDR, so connections
    in TIME_WAIT do not count), or None when it can."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host.strip("[]"), port))
        except OSError as exc:
            return exc
    return None


def bind_failure(host: str, port: int, hint: str = "pass --port or free it", detail: str = "") -> str:
    """The operator's sentence for a failed bind of *host*:*port*: a busy port names its holder
    (:func:`port_in_use_message`); anything else (an address not on this machine, no permission)
    says what the OS said."""
    exc = bind_error(host, port)
    if exc is not None and exc.errno == errno.EADDRINUSE:
        return port_in_use_message(port, hint)
    if exc is not None:
        return f"cannot listen on {host_port(host, port)}: {exc.strerror}"
    return f"cannot listen on {host_port(host, port)}" + (f": {detail}" if detail else "")
