"""The gateway's routing decision (pure): readiness views of every coordinator → one route."""

from __future__ import annotations

from motor_common.leadership import LeaderRole
from motor_gateway.routing import CoordinatorView, choose, retryable

A, B = "10.0.0.1:9100", "10.0.0.2:9100"


def master(addr: str, **kw: object) -> CoordinatorView:
    return CoordinatorView(addr, reachable=True, ready=True, reason="ok", role=LeaderRole.MASTER, **kw)  # type: ignore[arg-type]


def standby(addr: str, store: bool = True) -> CoordinatorView:
    return CoordinatorView(addr, reachable=True, reason="Coordinator is not master",
                           role=LeaderRole.STANDBY, store_available=store)


def isolated(addr: str, store: bool = False) -> CoordinatorView:
    return CoordinatorView(addr, reachable=True, reason="isolated", role=LeaderRole.MASTER,
                           isolated=True, store_available=store)


def down(addr: str) -> CoordinatorView:
    return CoordinatorView(addr, reachable=False)


def test_the_ready_master_gets_the_traffic_wherever_it_is_listed() -> None:
    assert choose([standby(A), master(B)]).address == B
    assert choose([master(A), standby(B)]).address == A


def test_two_ready_coordinators_keep_the_current_one() -> None:
    assert choose([master(A), master(B)], current=B).address == B
    assert choose([master(A), master(B)], current=None).address == A


def test_an_isolated_master_is_never_chosen_while_another_reaches_the_store() -> None:
    # Its network is cut; the standby still sees etcd and will win: wait for it.
    route = choose([isolated(A), standby(B, store=True)], current=A)
    assert route.address is None and "no master coordinator" in route.reason
    assert choose([isolated(A), master(B)], current=A).address == B


def test_when_nobody_reaches_the_store_the_isolated_master_serves_degraded() -> None:
    route = choose([isolated(A), standby(B, store=False)])
    assert route.address == A and route.degraded and route.ready


def test_degraded_mode_ignores_unreachable_coordinators_but_needs_one_reachable() -> None:
    assert choose([isolated(A), down(B)]).degraded
    assert choose([down(A), down(B)]).address is None


def test_a_frozen_master_and_a_standby_mean_no_route_yet() -> None:
    route = choose([down(A), standby(B)], current=A)
    assert route.address is None
    # By position, never by address: /ready shows this reason without authentication.
    assert route.reason == ("no master coordinator (coordinator 1: coordinator unreachable; "
                            "coordinator 2: Coordinator is not master)")
    assert A not in route.reason and B not in route.reason


def test_a_master_with_nothing_schedulable_still_gets_requests_for_its_precise_error() -> None:
    empty = CoordinatorView(A, reachable=True, reason="no schedulable", role=LeaderRole.MASTER)
    route = choose([empty, standby(B)])
    assert route.address == A and not route.ready and route.reason == "no schedulable"


def test_only_pre_head_unavailability_and_role_refusals_are_retried() -> None:
    assert retryable("UNAVAILABLE", None)
    assert retryable("UNAVAILABLE", "NOT_MASTER") and retryable("UNAVAILABLE", "ISOLATED")
    assert retryable("UNAVAILABLE", "REGISTRY_NOT_SYNCED")  # elected before its first sync
    assert not retryable("UNAVAILABLE", "NO_SCHEDULABLE_INSTANCE")
    assert not retryable("UNAVAILABLE", "PREFILL_FAILED")
    assert not retryable("DEADLINE_EXCEEDED", None)
    # a coordinator killed while it held the call: gRPC's own INTERNAL / UNKNOWN, no ErrorInfo
    assert retryable("INTERNAL", None) and retryable("UNKNOWN", None)
    assert not retryable("INTERNAL", "INTERNAL")  # the coordinator's own error (an exception it logged)
    assert not retryable("RESOURCE_EXHAUSTED", None)  # gRPC's size limits: another coordinator would refuse it too
