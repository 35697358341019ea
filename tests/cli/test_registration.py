"""Pure registration logic: endpoint parsing, id derivation, conflicts, delete resolution."""

from __future__ import annotations

import itertools

import pytest

from motor_cli.registration import (
    EndpointSpec,
    build_instance,
    default_job_name,
    derive_instance_id,
    parse_endpoint,
    plan_add,
    plan_set,
    resolve_delete,
)
from motor_common.domain import MAX_INSTANCE_ID, STANDALONE_ID_BIT, EngineType, Instance, Role
from motor_common.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound

EPS = ["10.0.0.1:8100,kv=5600", "10.0.0.2:8100,kv=5601", "10.0.0.1:8101,bootstrap=8998"]


def inst(role: Role, *eps: str, model: str = "tiny", job: str | None = None) -> Instance:
    return build_instance(role, model, EngineType.VLLM, [parse_endpoint(e) for e in eps], job)


def test_parse_endpoint_accepts_options_and_ipv6() -> None:
    assert parse_endpoint("127.0.0.1:8100") == EndpointSpec("127.0.0.1", 8100)
    assert parse_endpoint(" 10.0.0.1:8100, bootstrap=8998 ,kv=5600") == EndpointSpec("10.0.0.1", 8100, 8998, 5600)
    assert parse_endpoint("[::1]:9000,kv=1") == EndpointSpec("::1", 9000, 0, 1)
    assert parse_endpoint("[0:0::1]:9000") == parse_endpoint("[::1]:9000")


@pytest.mark.parametrize(
    "text",
    ["127.0.0.1", "host:8100", "127.0.0.1:80", "127.0.0.1:70000", "127.0.0.1:x", "127.0.0.1:8100,mgmt=1",
     "127.0.0.1:8100,kv", "127.0.0.1:8100,kv=0x", ":8100"],
)
def test_parse_endpoint_rejects_malformed_input(text: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_endpoint(text)


def test_an_endpoint_option_given_twice_is_refused_instead_of_the_last_one_winning() -> None:
    with pytest.raises(InvalidArgument, match=r"endpoint '10.0.0.1:8100,kv=5600,kv=5601': option kv is given twice"):
        parse_endpoint("10.0.0.1:8100,kv=5600,kv=5601")


def test_id_does_not_depend_on_endpoint_order() -> None:
    results = {(i.id, i.job_name, tuple(i.endpoints)) for order in itertools.permutations(EPS)
               for i in [inst(Role.DECODE, *order)]}
    assert len(results) == 1
    (_, _, endpoints), = results
    assert [e.id for e in endpoints] == [0, 1, 2]
    assert [(e.ip, e.business_port) for e in endpoints] == [("10.0.0.1", 8100), ("10.0.0.1", 8101), ("10.0.0.2", 8100)]


def test_id_is_in_the_standalone_namespace() -> None:
    for role in Role:
        iid = inst(role, *EPS).id
        assert iid & STANDALONE_ID_BIT
        assert iid <= MAX_INSTANCE_ID  # exact as a JSON/JavaScript number (a double)
        assert float(iid) == iid


def test_id_is_stable_across_releases() -> None:
    # Changing the derivation would re-identify every registered instance: pin it.
    iid = derive_instance_id(Role.PREFILL, [parse_endpoint("127.0.0.1:8100")])
    assert iid == derive_instance_id(Role.PREFILL, [EndpointSpec("127.0.0.1", 8100)])
    assert iid == PINNED_PREFILL_ID
    assert default_job_name(Role.PREFILL, iid) == f"standalone-prefill-{iid - STANDALONE_ID_BIT:013x}"


PINNED_PREFILL_ID = 5178729503920882  # bit 52 | blake2b-64 of 'prefill|127.0.0.1:8100,bootstrap=0,kv=0' & (2^52 - 1)


def test_id_depends_on_role_and_full_endpoint_group() -> None:
    base = inst(Role.PREFILL, "127.0.0.1:8100").id
    assert inst(Role.DECODE, "127.0.0.1:8100").id != base
    assert inst(Role.PREFILL, "127.0.0.1:8100,kv=5600").id != base
    assert inst(Role.PREFILL, "127.0.0.1:8100", "127.0.0.1:8101").id != base
    assert inst(Role.PREFILL, "127.0.0.1:8100", model="other").id == base  # model is not identity


def test_same_endpoint_twice_with_different_options_is_rejected() -> None:
    with pytest.raises(InvalidArgument):
        inst(Role.PREFILL, "127.0.0.1:8100", "127.0.0.1:8100,kv=1")


def test_add_of_identical_instance_is_a_noop_and_new_one_is_submitted() -> None:
    p = inst(Role.PREFILL, "127.0.0.1:8100")
    d = inst(Role.DECODE, "127.0.0.1:8200")
    submit, present = plan_add([p, d], [p])
    assert submit == [d]
    assert present == [p]


def test_add_refuses_an_endpoint_registered_under_another_id() -> None:
    existing = inst(Role.PREFILL, "127.0.0.1:8100")
    with pytest.raises(AlreadyExists, match=r"127\.0\.0\.1:8100 is already registered in instance"):
        plan_add([inst(Role.DECODE, "127.0.0.1:8100")], [existing])
    with pytest.raises(AlreadyExists):
        plan_add([inst(Role.PREFILL, "127.0.0.1:8100", "127.0.0.1:8101")], [existing])


def test_add_refuses_same_id_with_other_job_or_model() -> None:
    existing = inst(Role.PREFILL, "127.0.0.1:8100")
    for other in (inst(Role.PREFILL, "127.0.0.1:8100", job="custom"),
                  inst(Role.PREFILL, "127.0.0.1:8100", model="other")):
        with pytest.raises(AlreadyExists, match="delete it first"):
            plan_add([other], [existing])


def test_batch_with_an_endpoint_in_two_instances_is_rejected() -> None:
    with pytest.raises(InvalidArgument):
        plan_add([inst(Role.PREFILL, "127.0.0.1:8100"), inst(Role.DECODE, "127.0.0.1:8100")], [])


def test_set_refuses_to_drop_controller_managed_instances_unless_forced() -> None:
    managed = Instance(7, Role.DECODE, "job", "tiny", EngineType.VLLM, ())
    old = inst(Role.PREFILL, "127.0.0.1:8100")
    new = inst(Role.PREFILL, "127.0.0.1:8101")
    with pytest.raises(FailedPrecondition, match="--force"):
        plan_set([new], [managed, old])
    assert plan_set([new], [managed, old], force=True) == [managed, old]
    assert plan_set([new], [old]) == [old]


def test_delete_resolves_the_registered_identity_by_id_or_endpoint() -> None:
    registered = inst(Role.PREFILL, "127.0.0.1:8100", "127.0.0.1:8101", job="custom-job")
    other = inst(Role.DECODE, "127.0.0.1:8200")
    assert resolve_delete([registered, other], ids=[registered.id]) == [registered]
    assert resolve_delete([registered, other], endpoints=[parse_endpoint("127.0.0.1:8101")]) == [registered]
    both = resolve_delete([registered, other], ids=[registered.id, other.id],
                          endpoints=[parse_endpoint("127.0.0.1:8100")])
    assert sorted(i.id for i in both) == sorted([registered.id, other.id])


def test_delete_of_unknown_id_or_endpoint_is_refused() -> None:
    registered = inst(Role.PREFILL, "127.0.0.1:8100")
    with pytest.raises(NotFound, match="instance 42 is not registered"):
        resolve_delete([registered], ids=[42])
    with pytest.raises(NotFound, match=r"127\.0\.0\.1:9999"):
        resolve_delete([registered], endpoints=[parse_endpoint("127.0.0.1:9999")])
    with pytest.raises(InvalidArgument):
        resolve_delete([registered])


def test_kv_events_ports_are_parsed_registered_and_leave_other_ids_unchanged() -> None:
    spec = parse_endpoint("127.0.0.1:8100,kv_events=7100,kv_events_replay=7200")
    assert (spec.kv_events_port, spec.kv_events_replay_port) == (7100, 7200)
    i = inst(Role.PREFILL, "127.0.0.1:8100,kv_events=7100,kv_events_replay=7200")
    assert (i.endpoints[0].kv_events_port, i.endpoints[0].kv_events_replay_port) == (7100, 7200)
    plain = inst(Role.PREFILL, "127.0.0.1:8100")
    assert plain.id != i.id  # another engine configuration, another id
    assert parse_endpoint("127.0.0.1:8100").canonical() == "127.0.0.1:8100,bootstrap=0,kv=0"  # ids kept
    with pytest.raises(InvalidArgument, match="kv_events"):
        parse_endpoint("127.0.0.1:8100,kv_events=99999")
