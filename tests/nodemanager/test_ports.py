"""Engine port planning: OS picks never return this nodemanager's own (not yet bound) ports."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from motor_common.domain import EngineType, Role
from motor_nodemanager import config as nmconfig
from motor_nodemanager.app import NodeManagerApp
from motor_nodemanager.node import Node
from motor_nodemanager.ports import plan_endpoints, ports_of
from tests.nodemanager.conftest import nm_config


def picks(*ports: int) -> Iterator[int]:
    yield from ports


def test_free_picks_skip_the_nodemanagers_own_ports_and_each_other() -> None:
    it = picks(9300, 40000, 40000, 9301, 40001)
    eps = plan_endpoints(ip="127.0.0.1", count=1, base_port=0, engine_type=EngineType.VLLM, role=Role.PREFILL,
                         pick=lambda: next(it), avoid={9300, 9301})  # fmt: skip
    assert [(e.business_port, e.kv_port) for e in eps] == [(40000, 40001)]


def test_a_base_port_lays_out_business_kv_and_bootstrap_ports() -> None:
    eps = plan_endpoints(ip="h", count=2, base_port=20000, engine_type=EngineType.SGLANG, role=Role.PREFILL)
    assert [(e.business_port, e.kv_port, e.bootstrap_port) for e in eps] == [(20000, 0, 20004), (20001, 0, 20005)]


def test_kv_events_ports_follow_the_other_ports_with_a_base_port_and_are_distinct_picks_without() -> None:
    eps = plan_endpoints(ip="h", count=2, base_port=20000, engine_type=EngineType.VLLM, role=Role.PREFILL,
                         kv_events=True)  # fmt: skip
    assert [(e.kv_events_port, e.kv_events_replay_port) for e in eps] == [(20006, 20008), (20007, 20009)]
    it = picks(41000, 41001, 41002, 41002, 41003)
    one = plan_endpoints(ip="h", count=1, base_port=0, engine_type=EngineType.SGLANG, role=Role.DECODE,
                         pick=lambda: next(it), kv_events=True)  # fmt: skip
    assert [(e.business_port, e.kv_events_port, e.kv_events_replay_port) for e in one] == [(41000, 41001, 41002)]
    no_replay = plan_endpoints(ip="h", count=1, base_port=20000, engine_type=EngineType.VLLM, role=Role.DECODE,
                               kv_events=True, kv_events_replay=False)  # fmt: skip
    assert (no_replay[0].kv_events_port, no_replay[0].kv_events_replay_port) == (20003, 0)
    off = plan_endpoints(ip="h", count=1, base_port=20000, engine_type=EngineType.VLLM, role=Role.DECODE)
    assert (off[0].kv_events_port, off[0].kv_events_replay_port) == (0, 0)


def test_ports_of_lists_every_planned_port() -> None:
    eps = plan_endpoints(ip="h", count=2, base_port=20000, engine_type=EngineType.VLLM, role=Role.PREFILL,
                         kv_events=True)  # fmt: skip
    assert ports_of(eps) == {20000, 20001, 20002, 20003, 20006, 20007, 20008, 20009}


def test_an_engine_port_taken_by_the_nodemanagers_own_server_is_planned_anew(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Seen in a loaded run: the ops endpoint (port 0) was given the port just picked for the
    engine's KV side channel, and the engine exited with "address already in use"."""
    path = tmp_path / "nm.yaml"
    path.write_text(yaml.safe_dump(nm_config(1, str(tmp_path / "key"), tmp_path, endpoints_per_node=2)))
    app = NodeManagerApp(str(path))
    cfg = nmconfig.load(str(path))
    app._config = cfg
    before = app._plan_ports(cfg, set())
    app._node = Node(lambda: cfg, before)
    unrelated = max(ports_of(before)) + 1
    app.avoid_own_listeners({unrelated})  # no clash: the plan stands
    assert app.node.planned is before
    taken = before[1].kv_port
    with caplog.at_level(logging.WARNING, logger="motor_nodemanager.app"):
        app.avoid_own_listeners({taken, unrelated})
    after = app.node.planned
    assert taken not in ports_of(after) and unrelated not in ports_of(after)
    assert len(ports_of(after)) == len(ports_of(before)) == 4  # business + KV side channel, 2 engines
    assert [(e.id, e.ip, e.dp_rank, bool(e.kv_port)) for e in after] == [(e.id, e.ip, e.dp_rank, True) for e in before]
    assert "taken by its own server: planned anew" in caplog.text
