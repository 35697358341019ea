"""The test harness's ports (tests.helpers.free_port): outside the kernel's ephemeral range and never
handed out twice in one test process, even to servers started at once."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

from motor_common.ports import ephemeral_range
from tests.helpers import PORT_STRIDE, free_port


def test_ports_lie_outside_the_ephemeral_range_and_are_bindable() -> None:
    low, high = ephemeral_range()
    for _ in range(20):
        port = free_port()
        assert not low <= port <= high, port
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free when handed out


def test_concurrent_picks_never_repeat_even_before_anything_binds() -> None:
    # Nothing binds these ports: the kernel's bind(0) could hand one out twice in that window,
    # the harness's picker must not.
    with ThreadPoolExecutor(8) as pool:
        ports = list(pool.map(lambda _: free_port(), range(400)))
    assert len(set(ports)) == len(ports)


def test_picks_leave_room_for_derived_ports_and_skip_a_port_bound_meanwhile() -> None:
    first = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", first + PORT_STRIDE))
        nxt = free_port()
    assert nxt > first + PORT_STRIDE  # the taken one skipped, and the stride kept for DP offsets

