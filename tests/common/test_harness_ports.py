"""The test harness's ports (tests.helpers.free_port): outside the kernel's ephemeral range and never
handed out twice in one test process, even to servers started at once."""

from __future__ import annotations

import itertools
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

from motor_common.ports import ephemeral_range
from tests.helpers import PORT_STRIDE, _port_picker, free_port, harness_span


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



def test_each_xdist_worker_picks_from_a_slice_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    whole = harness_span()
    low, _ = ephemeral_range()
    assert whole[1] <= low  # below the ephemeral range
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    slices = []
    for i in range(3):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{i}")
        slices.append(harness_span())
    assert slices[0][0] == whole[0] and slices[2][1] <= whole[1]
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(slices))  # disjoint, in order
    assert all(hi - lo >= 5000 for lo, hi in slices)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    pick = _port_picker("127.0.0.1")  # a worker's picker stays in its slice, wrapping at the top
    assert all(slices[1][0] <= pick() < slices[1][1] for _ in range(400))
