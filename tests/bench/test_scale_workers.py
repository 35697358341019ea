"""bench/scale_workers.py's helpers: the model for more cores, the median of rounds, and the CPU
split by thread (read from this test's own threads). No benchmark figures."""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import pytest

from bench.scale_workers import (
    Row,
    front_capacity,
    median_row,
    settled,
    thread_cpu,
    thread_group,
    thread_split,
    variants,
)


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


def test_thread_group_names_the_event_loop_grpc_and_the_rest() -> None:
    assert thread_group(100, 100, "motor-coordinat") == "loop"  # the main thread, whatever its name
    assert thread_group(100, 101, "grpc_global_tim") == "grpc"
    assert thread_group(100, 102, "default-executo") == "grpc"
    assert thread_group(100, 103, "resolver-execu") == "grpc"
    assert thread_group(100, 105, "event_engine") == "grpc"
    assert thread_group(100, 106, "lifeguard") == "grpc"
    assert thread_group(100, 107, "python") == "other"  # a thread started from Python
    assert thread_group(100, 104, "asyncio_0") == "other"


def _spin(name: str, seconds: float, ready: threading.Event, done: threading.Event, tid: list[int]) -> None:
    # the OS thread name is what thread_cpu reads (Python's own thread name is not the comm)
    tid.append(threading.get_native_id())
    Path(f"/proc/self/task/{tid[0]}/comm").write_text(name)
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    ready.set()
    done.wait(10)


def test_thread_cpu_counts_a_grpc_named_thread_and_moves_it_to_other_when_it_ends() -> None:
    ready, done = threading.Event(), threading.Event()
    tid: list[int] = []
    t = threading.Thread(target=_spin, args=("grpc_bench_test", 0.2, ready, done, tid))
    before = thread_cpu([os.getpid()])
    t.start()
    assert ready.wait(10)
    live = thread_cpu([os.getpid()])
    assert live["grpc"] - before["grpc"] >= 0.15  # the spinning thread's CPU
    assert live["loop"] >= before["loop"]
    done.set()
    t.join(10)
    # join() returns when the Python thread is done; the OS thread leaves /proc a moment later
    deadline = time.monotonic() + 10
    while Path(f"/proc/self/task/{tid[0]}").exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # polling the condition, with a deadline
    ended = thread_cpu([os.getpid()])
    assert ended["grpc"] < live["grpc"] - 0.15  # it is gone from the live threads...
    assert ended["other"] - live["other"] >= 0.15  # ...and its CPU stays in the process's total
    assert thread_cpu([2**22 + 12345]) == {"loop": 0.0, "grpc": 0.0, "other": 0.0}  # no such process


def test_thread_split_is_per_request_microseconds_and_never_negative() -> None:
    before = {"gateway": {"loop": 1.0, "grpc": 0.5, "other": 0.1},
              "coordinator": {"loop": 2.0, "grpc": 0.2, "other": 0.3}}
    after = {"gateway": {"loop": 1.5, "grpc": 0.4, "other": 0.2},
             "coordinator": {"loop": 3.0, "grpc": 0.21, "other": 0.3}}
    split = thread_split(before, after, 1000)
    assert split == pytest.approx({"gateway loop": 500, "gateway grpc": 0, "gateway other": 100,
                                   "coordinator loop": 1000, "coordinator grpc": 10, "coordinator other": 0})


def test_median_row_takes_the_median_of_each_thread_group() -> None:
    rows = [_row(100, 0, 500), _row(300, 0, 700), _row(200, 0, 600)]
    for r, v in zip(rows, (10.0, 30.0, 20.0), strict=True):
        r.threads = {"coordinator loop": v * 10, "coordinator grpc": v}
    assert median_row(rows).threads == {"coordinator loop": 200, "coordinator grpc": 20}
