"""bench/scale_workers.py's pure helpers: the model for more cores and the median of rounds. No
processes, no benchmark figures."""

from __future__ import annotations

import argparse

import pytest

from bench.scale_workers import Row, front_capacity, median_row, settled, variants


def test_the_front_is_capped_by_the_tier_until_the_coordinators_core() -> None:
    # a tier core serves 1e6 / 500 = 2,000 req/s; the coordinator's core 1e6 / 100 = 10,000 req/s
    assert [front_capacity(p, 500, 100) for p in (2, 4, 6, 8, 16)] == [2000, 6000, 10000, 10000, 10000]


def test_a_coordinator_dearer_than_a_tier_core_caps_the_front_whatever_the_cores() -> None:
    # the gateway-worker shape: the coordinator does the heavier half of every request
    assert [front_capacity(p, 667, 1020) for p in (2, 4, 8, 16)] == [pytest.approx(1e6 / 1020)] * 4


def test_no_core_for_the_tier_serves_nothing_and_costs_must_be_positive() -> None:
    assert front_capacity(1, 500, 100) == 0
    with pytest.raises(ValueError):
        front_capacity(4, 0, 100)
    with pytest.raises(ValueError):
        front_capacity(4, 500, -1)


def _row(rps: float, failures: int, us: float) -> Row:
    return Row("co-2", 64, rps, 1.0, failures, us, us / 10, 900, 300, 0.5, 0.1, 3.0)


def test_median_row_takes_each_field_median_and_keeps_failures_an_int() -> None:
    m = median_row([_row(100, 0, 500), _row(300, 3, 700), _row(200, 1, 600)])
    assert (m.variant, m.conc, m.rps, m.us_gateway, m.us_coordinator) == ("co-2", 64, 200, 600, 60)
    assert m.failures == 1 and isinstance(m.failures, int)
    assert median_row([_row(100, 0, 500), _row(300, 1, 700)]).failures == 0  # median 0.5 → 0


def _args(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = {"gateway": True, "co_located": True, "pinned": True, "workers": [1, 2],
                               "co_workers": [1, 2]}
    return argparse.Namespace(**{**base, **kw})


def test_variants_co_rows_set_http_workers_and_pin_only_multi_worker_fronts() -> None:
    vs = {name: (kw, pinning) for name, kw, pinning in variants(_args(gateway=False))}
    assert list(vs) == ["co-1", "co-2", "co-2@cpu0", "co-2@spread"]
    assert vs["co-1"] == ({"co_located": True, "config": {"http": {"workers": 1}}}, "")
    assert vs["co-2@spread"] == ({"co_located": True, "config": {"http": {"workers": 2}}}, "spread")


def test_variants_keep_the_gateway_rows() -> None:
    names = [name for name, _, _ in variants(_args(co_located=False, pinned=False))]
    assert names == ["gw-1", "gw-2"]
    assert [n for n, _, p in variants(_args(co_located=False)) if p] == ["gw-1@cpu0", "gw-2@cpu0"]


def test_settled_needs_the_last_windows_all_below_the_threshold() -> None:
    assert not settled([], 0.1)
    assert not settled([0.05], 0.1)  # one window is not enough
    assert not settled([0.05, 0.9], 0.1)  # a worker still importing
    assert settled([0.9, 0.05, 0.02], 0.1)
    assert not settled([0.05, 0.02, 0.1], 0.1)  # at the threshold is not below it
