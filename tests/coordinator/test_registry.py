"""Registry rules as pure state transitions: every rejected call leaves the state untouched."""

from __future__ import annotations

from dataclasses import replace

import pytest

from motor_common.domain import Endpoint, EngineType, InstanceStatus, Role
from motor_common.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from motor_coordinator import registry
from motor_coordinator.registry import RegistryState
from tests.coordinator.factories import ep, inst


def base() -> RegistryState:
    return registry.set_instances(RegistryState(), [inst(1, Role.PREFILL), inst(2, Role.DECODE)], 0)


def test_set_replaces_the_whole_set_and_advances_generation() -> None:
    s = base()
    assert s.generation == 1 and set(s.instances) == {1, 2}
    s2 = registry.set_instances(s, [inst(3, Role.UNION)], 0)
    assert set(s2.instances) == {3} and s2.generation == 2
    assert set(s.instances) == {1, 2}  # old snapshot untouched


def test_set_with_duplicate_id_is_invalid_and_applies_nothing() -> None:
    s = base()
    with pytest.raises(InvalidArgument) as err:
        registry.set_instances(s, [inst(5), inst(5, Role.DECODE)], 0)
    assert err.value.reason == "DUPLICATE_INSTANCE_ID"
    assert set(s.instances) == {1, 2} and s.generation == 1


def test_set_with_an_endpoint_claimed_twice_is_invalid() -> None:
    with pytest.raises(InvalidArgument, match="claimed by instances"):
        registry.set_instances(RegistryState(), [inst(1, ports=(9000,)), inst(2, Role.DECODE, ports=(9000,))], 0)


def test_set_registers_paused_instances_paused_and_others_available() -> None:
    s = registry.set_instances(
        RegistryState(),
        [inst(1, status=InstanceStatus.PAUSED), inst(2, Role.DECODE, status=InstanceStatus.UNAVAILABLE)],
        0,
    )
    assert s.instances[1].status is InstanceStatus.PAUSED
    assert s.instances[2].status is InstanceStatus.AVAILABLE


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (replace(inst(9), job_name=" "), "INVALID_INSTANCE"),
        (replace(inst(9), model_name=""), "INVALID_INSTANCE"),
        (replace(inst(9), endpoints=()), "INVALID_INSTANCE"),
        (replace(inst(9), endpoints=(ep(9000, ip="not-an-ip"),)), "INVALID_ENDPOINT"),
        (replace(inst(9), endpoints=(ep(9000, ip="300.1.1.1"),)), "INVALID_ENDPOINT"),
        (replace(inst(9), endpoints=(ep(1023),)), "INVALID_ENDPOINT"),
        (replace(inst(9), endpoints=(ep(65536),)), "INVALID_ENDPOINT"),
        (replace(inst(9), endpoints=(replace(ep(9000), kv_events_port=70000),)), "INVALID_ENDPOINT"),
        (replace(inst(9), endpoints=(replace(ep(9000), kv_events_replay_port=70000),)), "INVALID_ENDPOINT"),
        (replace(inst(9), endpoints=(ep(9000, id=0), ep(9001, id=0))), "DUPLICATE_ENDPOINT"),
        (replace(inst(9), endpoints=(ep(9000, id=0), ep(9000, id=1))), "DUPLICATE_ENDPOINT"),
        (inst(9, engine=EngineType.SGLANG, endpoints=(ep(9000),)), "MISSING_BOOTSTRAP_PORT"),
    ],
)
def test_invalid_instances_are_rejected_and_change_nothing(bad: object, reason: str) -> None:
    s = base()
    for op in (
        lambda: registry.set_instances(s, [bad], 0),  # type: ignore[list-item]
        lambda: registry.add_instances(s, [bad], 0),  # type: ignore[list-item]
    ):
        with pytest.raises(InvalidArgument) as err:
            op()
        assert err.value.reason == reason
    assert s == base()


def test_ipv6_endpoints_and_sglang_prefill_with_bootstrap_are_valid() -> None:
    good = inst(7, engine=EngineType.SGLANG, endpoints=(Endpoint(0, "::1", 9000, bootstrap_port=9100),))
    s = registry.set_instances(RegistryState(), [good], 0)
    assert 7 in s.instances


def test_add_new_ids_and_report_them() -> None:
    s, added = registry.add_instances(base(), [inst(3, Role.UNION)], 0)
    assert added == [3] and set(s.instances) == {1, 2, 3} and s.generation == 2


def test_identical_readd_is_idempotent_regardless_of_endpoint_order() -> None:
    two = inst(3, ports=(9001, 9002))
    s, _ = registry.add_instances(base(), [two], 0)
    reordered = replace(two, endpoints=tuple(reversed(two.endpoints)))
    s2, added = registry.add_instances(s, [reordered], 0)
    assert added == [] and s2.instances[3] == s.instances[3]


def test_readd_keeps_pause_state() -> None:
    s = registry.pause_instances(base(), [1], 0)
    s2, added = registry.add_instances(s, [inst(1)], 0)
    assert added == [] and s2.instances[1].status is InstanceStatus.PAUSED


@pytest.mark.parametrize(
    "other",
    [
        inst(1, Role.DECODE),  # another role
        inst(1, job="other-job"),  # another job
        inst(1, ports=(9999,)),  # another endpoint group
        inst(1, ports=(10001, 9999)),  # a superset
    ],
)
def test_add_of_existing_id_with_other_identity_is_already_exists_and_atomic(other: object) -> None:
    s = base()
    with pytest.raises(AlreadyExists) as err:
        registry.add_instances(s, [inst(3, Role.UNION), other], 0)  # type: ignore[list-item]
    assert err.value.reason == "INSTANCE_ID_CONFLICT"
    assert set(s.instances) == {1, 2}


def test_ids_are_unique_across_roles_and_pools() -> None:
    s = registry.pause_instances(base(), [2], 0)  # 2 is a paused decode
    with pytest.raises(AlreadyExists):
        registry.add_instances(s, [inst(2, Role.UNION, ports=(12345,))], 0)


def test_add_of_an_endpoint_served_by_another_instance_is_already_exists() -> None:
    with pytest.raises(AlreadyExists) as err:
        registry.add_instances(base(), [inst(3, Role.UNION, ports=(10001,))], 0)
    assert err.value.reason == "ENDPOINT_IN_USE"


def test_add_with_duplicate_ids_in_one_request_is_invalid() -> None:
    with pytest.raises(InvalidArgument):
        registry.add_instances(base(), [inst(3), inst(3)], 0)


def test_delete_checks_identity_order_independently() -> None:
    two = inst(3, ports=(9001, 9002))
    s, _ = registry.add_instances(base(), [two], 0)
    s2, deleted = registry.delete_instances(s, [replace(two, endpoints=tuple(reversed(two.endpoints)))], 0)
    assert deleted == [3] and 3 not in s2.instances


@pytest.mark.parametrize("other", [inst(1, Role.DECODE), inst(1, job="x"), inst(1, ports=(9999,))])
def test_delete_with_mismatched_identity_is_failed_precondition_and_atomic(other: object) -> None:
    s = base()
    with pytest.raises(FailedPrecondition) as err:
        registry.delete_instances(s, [inst(2, Role.DECODE), other], 0)  # type: ignore[list-item]
    assert err.value.reason == "IDENTITY_MISMATCH"
    assert set(s.instances) == {1, 2}


def test_delete_unknown_id_is_not_found_and_atomic() -> None:
    s = base()
    with pytest.raises(NotFound):
        registry.delete_instances(s, [inst(1), inst(42)], 0)
    assert set(s.instances) == {1, 2}


def test_delete_of_a_paused_instance_works() -> None:
    s = registry.pause_instances(base(), [1], 0)
    s2, _ = registry.delete_instances(s, [inst(1)], 0)
    assert set(s2.instances) == {2}


def test_pause_and_resume_keep_the_instance_and_unknown_ids_are_not_found() -> None:
    s = registry.pause_instances(base(), [1, 1], 0)
    assert s.instances[1].status is InstanceStatus.PAUSED
    s = registry.resume_instances(s, [1], 0)
    assert s.instances[1].status is InstanceStatus.AVAILABLE
    for op in (registry.pause_instances, registry.resume_instances):
        with pytest.raises(NotFound):
            op(s, [1, 77], 0)
    assert s.instances[1].status is InstanceStatus.AVAILABLE


# -- generations ----------------------------------------------------------------------------


def test_set_generation_must_not_go_back() -> None:
    s = registry.set_instances(RegistryState(), [inst(1)], 10)
    assert s.generation == 10
    assert registry.set_instances(s, [inst(1)], 10).generation == 10  # idempotent retry
    assert registry.set_instances(s, [inst(1)], 15).generation == 15
    with pytest.raises(Aborted) as err:
        registry.set_instances(s, [inst(2)], 9)
    assert err.value.reason == "STALE_GENERATION"
    assert registry.set_instances(s, [inst(1)], 0).generation == 11


def test_if_generation_applies_only_at_exactly_that_generation() -> None:
    registry.check_if_generation(7, None, 0)  # no condition
    registry.check_if_generation(7, 7, 0)
    for stale in (0, 6, 8):
        with pytest.raises(Aborted) as err:
            registry.check_if_generation(7, stale, 0)
        assert err.value.reason == "GENERATION_CHANGED"
        assert err.value.metadata == {"current_generation": "7", "if_generation": str(stale)}
    with pytest.raises(InvalidArgument) as bad:
        registry.check_if_generation(7, 7, 8)  # a tracked caller does not also condition
    assert bad.value.reason == "CONFLICTING_GENERATIONS"


_STATUS_OPS = [
    lambda s, g: registry.pause_instances(s, [1], g),
    lambda s, g: registry.resume_instances(s, [1], g),
]


@pytest.mark.parametrize(
    "op",
    [
        lambda s, g: registry.add_instances(s, [inst(3, Role.UNION)], g),
        lambda s, g: registry.delete_instances(s, [inst(1)], g),
        *_STATUS_OPS,
    ],
)
def test_increments_need_exactly_current_plus_one(op: object) -> None:
    s = registry.set_instances(RegistryState(), [inst(1), inst(2, Role.DECODE)], 5)
    with pytest.raises(Aborted) as stale:
        op(s, 5)  # type: ignore[operator]
    assert stale.value.reason == "STALE_GENERATION"
    with pytest.raises(FailedPrecondition) as gap:
        op(s, 7)  # type: ignore[operator]
    assert gap.value.reason == "GENERATION_GAP"
    out = op(s, 6)  # type: ignore[operator]
    new = out[0] if isinstance(out, tuple) else out
    assert new.generation == 6
    if op in _STATUS_OPS:  # untracked pause/resume on a controller-fed registry: refused (issue 16)
        with pytest.raises(FailedPrecondition, match="managed by a controller"):
            op(s, 0)  # type: ignore[operator]
        return
    out0 = op(s, 0)  # type: ignore[operator]
    assert (out0[0] if isinstance(out0, tuple) else out0).generation == 6
    assert s.generation == 5


def test_list_pages_are_sorted_by_id_and_filter_by_role() -> None:
    insts = [inst(i, Role.PREFILL if i % 2 else Role.DECODE) for i in range(10, 0, -1)]
    page, token = registry.list_page(insts, None, 4, "")
    assert [i.id for i in page] == [1, 2, 3, 4] and token == "4"
    page, token = registry.list_page(insts, None, 4, token)
    assert [i.id for i in page] == [5, 6, 7, 8]
    page, token = registry.list_page(insts, None, 4, token)
    assert [i.id for i in page] == [9, 10] and token == ""
    page, _ = registry.list_page(insts, Role.DECODE, 0, "")
    assert [i.id for i in page] == [2, 4, 6, 8, 10]
    with pytest.raises(InvalidArgument):
        registry.list_page(insts, None, 0, "garbage")


def test_untracked_pause_and_resume_are_refused_once_a_controller_manages_the_registry() -> None:
    standalone = base()
    assert not standalone.managed
    assert registry.pause_instances(standalone, [1], 0).instances[1].status is InstanceStatus.PAUSED
    managed = registry.set_instances(RegistryState(), [inst(1), inst(2, Role.DECODE)], 7)
    assert managed.managed
    for change in (registry.pause_instances, registry.resume_instances):
        with pytest.raises(FailedPrecondition) as err:
            change(managed, [1], 0)
        assert err.value.reason == "MANAGED_BY_CONTROLLER" and "controller" in str(err.value)
    # The controller's own (tracked) pause still applies, and the state keeps being managed.
    paused = registry.pause_instances(managed, [1], 8)
    assert paused.instances[1].status is InstanceStatus.PAUSED and paused.managed
    assert registry.add_instances(paused, [inst(3, Role.UNION)], 0)[0].managed


def test_an_ipv4_mapped_ipv6_address_is_the_same_endpoint_as_its_ipv4() -> None:
    """Both reach the same engine on a dual-stack host: one endpoint, one instance."""
    mapped = inst(3, Role.UNION, endpoints=(Endpoint(0, "::ffff:127.0.0.1", 10001),))  # instance 1's engine
    with pytest.raises(AlreadyExists) as err:
        registry.add_instances(base(), [mapped], 0)
    assert err.value.reason == "ENDPOINT_IN_USE"


@pytest.mark.parametrize("ip", ["fe80::1%eth0\n2024-01-01 ERROR forged", "fe80::1%et h0", "fe80::1%\u00e9th0"])
def test_an_ipv6_zone_id_with_control_spaces_or_non_ascii_is_invalid(ip: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        registry.add_instances(base(), [inst(3, Role.UNION, endpoints=(Endpoint(0, ip, 10003),))], 0)
    assert err.value.reason == "INVALID_ENDPOINT"
    assert registry.add_instances(base(), [inst(3, Role.UNION, endpoints=(Endpoint(0, "fe80::1%eth0", 10003),))], 0)
