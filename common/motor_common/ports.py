"""Ports: the programs' defaults, ``host:port`` text, and finding a free port."""

from __future__ import annotations

import socket

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


def port_free(host: str, port: int) -> bool:
    """Whether *port* on *host* can be bound now."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        try:
            s.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True
