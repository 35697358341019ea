from __future__ import annotations

from motor_common.domain import MAX_INSTANCE_ID, STANDALONE_ID_BIT, Capabilities, Role
from motor_controller.assembly import assemble, instance_id_for, start_commands
from tests.controller.factories import spec


def test_instance_id_is_deterministic_below_2_52_and_never_sets_the_standalone_bit() -> None:
    for job in ("a", "job-p", "x" * 200):
        for inc in range(5):
            iid = instance_id_for(job, inc)
            assert iid == instance_id_for(job, inc)
            assert 0 < iid < 1 << 52 and not iid & STANDALONE_ID_BIT
            assert iid <= MAX_INSTANCE_ID and float(iid) == iid  # exact in JSON/JavaScript
    assert instance_id_for("a", 0) != instance_id_for("a", 1) != instance_id_for("b", 0)


def test_incomplete_job_is_not_assembled_yet() -> None:
    assert assemble("job-p", [spec(0, 3), spec(2, 3)], 0, 29550) is None
    assert assemble("job-p", [], 0, 29550) is None


def test_global_dp_ranks_node_ranks_and_master_address() -> None:
    nodes = [spec(1, 2, eps=4), spec(0, 2, eps=4)]  # input order must not matter
    a = assemble("job-p", nodes, 0, 29550)
    assert a is not None and a.instance is not None
    assert a.node_ids == ("job-p-n0", "job-p-n1")
    assert a.master_address == "10.0.0.1:29550"
    ranks = [(e.node_id, e.dp_rank, e.id, e.business_port) for e in a.instance.endpoints]
    assert ranks == [("job-p-n0", r, r, 8000 + r) for r in range(4)] + [
        ("job-p-n1", 4 + r, 4 + r, 8000 + r) for r in range(4)
    ]
    assert a.instance.id == instance_id_for("job-p", 0)
    assert a == assemble("job-p", list(reversed(nodes)), 0, 29550)


def test_ipv6_master_address_is_bracketed() -> None:
    a = assemble("j", [spec(0, 1, ip="fd00::1")], 0, 29550)
    assert a is not None and a.master_address == "[fd00::1]:29550"


def test_capability_mismatch_fails_closed_with_reason() -> None:
    nodes = [spec(0, 2, caps=Capabilities(True, True, False)), spec(1, 2, caps=Capabilities(True, False, False))]
    a = assemble("job-p", nodes, 0, 29550)
    assert a is not None and a.instance is None
    assert "capabilities differ" in a.reason and "job-p-n1" in a.reason


def test_disagreeing_nodes_fail_closed() -> None:
    a = assemble("j", [spec(0, 2, job="j"), spec(1, 2, job="j", role=Role.DECODE)], 0, 1)
    assert a is not None and a.instance is None and "role" in a.reason
    b = assemble("j", [spec(0, 2, job="j", eps=2), spec(1, 2, job="j", eps=3)], 0, 1)
    assert b is not None and b.instance is None and "endpoints per node" in b.reason
    c = assemble("j", [spec(0, 2, job="j"), spec(1, 3, job="j")], 0, 1)
    assert c is not None and c.instance is None and "nodes_per_instance" in c.reason


def test_start_commands_carry_node_endpoints_dp_size_and_master() -> None:
    nodes = [spec(0, 2, eps=2, role=Role.DECODE), spec(1, 2, eps=2, role=Role.DECODE)]
    a = assemble("job-p", nodes, 0, 29550)
    assert a is not None and a.instance is not None
    cmds = start_commands(a.instance, nodes, a.master_address, 29550, 1)
    c1 = cmds["job-p-n1"]
    assert [e.dp_rank for e in c1.endpoints] == [2, 3]
    assert (c1.node_rank, c1.num_nodes, c1.dp_size, c1.master_address, c1.master_port) == (1, 2, 4, "10.0.0.1", 29550)
    assert c1.admin_address == "10.0.0.2:7001"
    assert len(c1.peers) == 4  # decode instances get their D2D peers


def test_kv_events_ports_are_carried_into_the_instance_and_start_commands() -> None:
    from dataclasses import replace

    s = spec(0, 1, eps=2)
    s = replace(s, endpoints=tuple(replace(e, kv_events_port=6000 + e.id, kv_events_replay_port=6100 + e.id)
                                   for e in s.endpoints))  # fmt: skip
    a = assemble("job-p", [s], 0, 29550)
    assert a is not None and a.instance is not None
    got = [(e.kv_events_port, e.kv_events_replay_port) for e in a.instance.endpoints]
    assert got == [(6000, 6100), (6001, 6101)]
    cmds = start_commands(a.instance, [s], a.master_address, 29550, 1)
    assert [e.kv_events_port for e in cmds[s.node_id].endpoints] == [6000, 6001]
