"""Port helpers: scanning for a program's port outside the kernel's ephemeral range."""

from __future__ import annotations

import socket

import pytest

from motor_common import ports
from motor_common.ports import (
    engine_port_picker,
    ephemeral_range,
    free_port,
    port_free,
    scan_free_port,
)


def test_scan_skips_bound_and_avoided_ports() -> None:
    low, _ = ephemeral_range()
    start = 21000 if low > 22000 else 1500  # below the ephemeral range on any sane kernel
    while not port_free("127.0.0.1", start):
        start += 10
    with socket.socket() as held:
        held.bind(("127.0.0.1", start))
        held.listen()
        got = scan_free_port("127.0.0.1", start, avoid={start + 1})
    assert got not in (start, start + 1) and got >= start + 2


def test_scan_never_returns_a_port_in_the_ephemeral_range() -> None:
    low, high = ephemeral_range()
    if high >= 65535:
        pytest.skip(f"ephemeral range {low}-{high} reaches the top: nothing above it")
    got = scan_free_port("127.0.0.1", low)
    assert got > high


def test_free_port_is_an_os_pick_from_the_ephemeral_range() -> None:
    low, high = ephemeral_range()
    assert low <= free_port() <= high


def test_engine_ports_are_distinct_free_and_outside_the_ephemeral_range() -> None:
    """A nodemanager's engine ports (base_port 0): no other program's bind(0) can be handed one
    (seen: another nodemanager's ops endpoint took an engine's planned port, answered its /health
    and 404'd its requests)."""

    low, high = ephemeral_range()
    pick = engine_port_picker("127.0.0.1")
    ports = [pick() for _ in range(12)]
    assert len(set(ports)) == 12
    assert all(not low <= p <= high and port_free("127.0.0.1", p) for p in ports), (ports, low, high)


def test_engine_picks_keep_their_stride_and_start_again_low_past_the_top(monkeypatch: pytest.MonkeyPatch) -> None:
    low, _ = ephemeral_range()
    monkeypatch.setattr(ports.random, "randrange", lambda *_: 65530)  # the picker starts near the top
    pick = engine_port_picker("127.0.0.1", stride=16)
    first = pick()
    assert first >= 65530 or 10000 <= first < low  # 65530.. when free, else already wrapped
    second = pick()  # 65530 + 16 is past the last port: the scan starts again at 10000
    assert 10000 <= second < low and second != first
    assert pick() >= second + 16

