"""The engine state file and the checks that decide what a restarted nodemanager may adopt."""

from __future__ import annotations

import json
import os
from pathlib import Path

from motor_common.domain import Endpoint
from motor_nodemanager import adoption
from motor_nodemanager.adoption import EngineRecord
from motor_nodemanager.launch import LaunchPlan

STAT = "4242 (motor sim (x)) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10 " + "0 " * 30


def plan(*argv: str, **env: str) -> LaunchPlan:
    return LaunchPlan(Endpoint(0, "127.0.0.1", 9000), 0, argv, env)


def test_the_start_time_is_field_22_read_past_a_command_name_with_spaces_and_parentheses() -> None:
    assert adoption.start_time_of(STAT) == 987654
    assert adoption.start_time_of("4242 (x) S 1") is None


def test_this_process_is_its_own_recorded_process_and_a_differing_start_time_is_not() -> None:
    start = adoption.process_start_time(os.getpid())
    assert start is not None
    rec = EngineRecord(0, os.getpid(), os.getpid(), start, "f")
    assert adoption.is_recorded_process(rec)
    assert not adoption.is_recorded_process(EngineRecord(0, os.getpid(), os.getpid(), start + 1, "f"))
    assert not adoption.is_recorded_process(EngineRecord(0, 0, 0, start, "f"))


def test_the_fingerprint_changes_with_any_arg_or_env_value_and_not_with_env_order() -> None:
    base = adoption.fingerprint(plan("sim", "--port", "9000", A="1", B="2"))
    assert base == adoption.fingerprint(LaunchPlan(Endpoint(0, "127.0.0.1", 9000), 0, ("sim", "--port", "9000"),
                                                   {"B": "2", "A": "1"}))  # fmt: skip
    assert base != adoption.fingerprint(plan("sim", "--port", "9001", A="1", B="2"))
    assert base != adoption.fingerprint(plan("sim", "--port", "9000", A="1", B="3"))


def test_records_round_trip_an_empty_list_removes_the_file_and_a_bad_file_is_ignored(tmp_path: Path) -> None:
    path = str(tmp_path / "d" / "engines.json")
    recs = [EngineRecord(0, 10, 10, 5, "f", business_port=9000, kv_port=9001, started_at=1.5)]
    adoption.save(path, recs)
    assert adoption.load(path) == recs
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["engines.json"]  # no temp file left
    adoption.save(path, [])
    assert not Path(path).exists() and adoption.load(path) == []
    Path(path).write_text("{not json")
    assert adoption.load(path) == []
    Path(path).write_text(json.dumps({"version": 99, "engines": []}))
    assert adoption.load(path) == []
    good = {"endpoint_id": 0, "pid": 10, "pgid": 10, "start_time": 5, "fingerprint": "f"}
    for bad in ({"pid": "10"}, {"pgid": -1}, {"start_time": True}, {"fingerprint": 7}, {"started_at": "x"}):
        Path(path).write_text(json.dumps({"version": 1, "engines": [{**good, **bad}]}))
        assert adoption.load(path) == [], bad  # never a record a later pid comparison or kill trips on
    Path(path).write_text(json.dumps({"version": 1, "engines": [good]}))
    assert adoption.load(path) == [EngineRecord(0, 10, 10, 5, "f")]
    Path(path).write_text(json.dumps({"version": 1, "engines": [{"pid": 1}]}))
    assert adoption.load(path) == []


def test_the_state_path_is_the_configured_one_else_beside_the_engine_logs_else_none() -> None:
    assert adoption.state_path("/s/e.json", "/logs", "n") == "/s/e.json"
    assert adoption.state_path(None, "/logs", "host:job:0") == "/logs/host_job_0.engines.json"
    assert adoption.state_path(None, None, "n") is None


def test_planned_endpoints_take_the_recorded_ports_of_the_same_endpoint_id() -> None:
    planned = (Endpoint(0, "127.0.0.1", 1000, kv_port=1001), Endpoint(1, "127.0.0.1", 1002, kv_port=1003))
    out = adoption.with_recorded_ports(planned, [EngineRecord(1, 10, 10, 5, "f", business_port=2000, kv_port=2001)])
    assert [(e.business_port, e.kv_port) for e in out] == [(1000, 1001), (2000, 2001)]
