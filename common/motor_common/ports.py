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


def port_free(host: str, port: int) -> bool:
    """Whether *port* on *host* can be bound now."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        try:
            s.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True
