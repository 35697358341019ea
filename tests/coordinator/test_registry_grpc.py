"""The registry through the real gRPC API of an in-process coordinator (no engines: probes off)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from motor_common.domain import InstanceStatus, Role
from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.grpc_server import ServerConfig, error_reason
from motor_coordinator.app import Coordinator
from motor_coordinator.config import CoordinatorConfig, DispatchConfig
from motor_coordinator.dispatch_service import SERVICE_NAME as DISPATCH
from motor_coordinator.registry import MAX_GENERATION
from tests.coordinator.factories import inst
from tests.coordinator.grpc_util import KEY, MD, Stubs, pbs
from tests.helpers import wait_for

P, D, U = inst(1, Role.PREFILL), inst(2, Role.DECODE), inst(3, Role.UNION)


@pytest.fixture
async def coord() -> AsyncIterator[tuple[Coordinator, Stubs]]:
    cfg = CoordinatorConfig(
        server=ServerConfig(port=0),
        dispatch=DispatchConfig(health_probe_interval_sec=0, metrics_scrape_interval_sec=0),
    )
    app = Coordinator(cfg, management_key=KEY)
    port = await app.start()
    stubs = Stubs(f"127.0.0.1:{port}")
    yield app, stubs
    await stubs.close()
    await app.stop(0)


async def expect(code: grpc.StatusCode, call: object, reason: str | None = None) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    assert err.value.code() == code, err.value.details()
    if reason is not None:
        assert error_reason(err.value) == reason
    return err.value


async def test_management_calls_without_the_key_are_unauthenticated_and_change_nothing(
    coord: tuple[Coordinator, Stubs],
) -> None:
    _, s = coord
    await expect(grpc.StatusCode.UNAUTHENTICATED,
                 s.registry.SetInstances(cpb.SetInstancesRequest(instances=[]), timeout=5))
    await expect(grpc.StatusCode.UNAUTHENTICATED, s.registry.ListInstances(cpb.ListInstancesRequest(), timeout=5))
    assert (await s.list()).generation == 0
    # the data plane needs no key
    assert not (await s.readiness()).ready


async def test_set_duplicate_id_is_invalid_argument_and_applies_nothing(coord: tuple[Coordinator, Stubs]) -> None:
    _, s = coord
    await s.set(P, D)
    await expect(grpc.StatusCode.INVALID_ARGUMENT, s.set(U, replace(U, role=Role.PREFILL)), "DUPLICATE_INSTANCE_ID")
    assert await s.ids() == {1, 2}


async def test_invalid_payloads_are_invalid_argument(coord: tuple[Coordinator, Stubs]) -> None:
    _, s = coord
    bad_role = tpb.Instance(id=9, job_name="j", model_name="m", engine_type=tpb.ENGINE_TYPE_VLLM,
                            endpoints=[tpb.Endpoint(ip="127.0.0.1", business_port=9000)])
    err = await expect(grpc.StatusCode.INVALID_ARGUMENT,
                       s.registry.AddInstances(cpb.AddInstancesRequest(instances=[bad_role]), metadata=MD, timeout=5))
    assert "instances[0].role" in (err.details() or "")
    await expect(grpc.StatusCode.INVALID_ARGUMENT, s.add(replace(U, endpoints=())), "INVALID_INSTANCE")
    assert await s.ids() == set()


async def test_add_conflicting_identity_is_already_exists_and_identical_readd_is_a_noop(
    coord: tuple[Coordinator, Stubs],
) -> None:
    _, s = coord
    two = inst(4, Role.DECODE, ports=(9001, 9002))
    assert list((await s.add(P, two)).added_ids) == [1, 4]
    again = await s.add(replace(two, endpoints=tuple(reversed(two.endpoints))))
    assert list(again.added_ids) == []
    await expect(grpc.StatusCode.ALREADY_EXISTS, s.add(U, replace(P, job_name="other")), "INSTANCE_ID_CONFLICT")
    await expect(grpc.StatusCode.ALREADY_EXISTS, s.add(replace(P, role=Role.DECODE)))
    assert await s.ids() == {1, 4}


async def test_delete_checks_identity_and_unknown_ids(coord: tuple[Coordinator, Stubs]) -> None:
    _, s = coord
    await s.set(P, D)
    await expect(grpc.StatusCode.FAILED_PRECONDITION, s.delete(replace(P, role=Role.UNION)), "IDENTITY_MISMATCH")
    await expect(grpc.StatusCode.FAILED_PRECONDITION, s.delete(inst(1, ports=(9999,))), "IDENTITY_MISMATCH")
    await expect(grpc.StatusCode.NOT_FOUND, s.delete(inst(77)), "INSTANCE_NOT_FOUND")
    assert await s.ids() == {1, 2}
    assert list((await s.delete(P)).deleted_ids) == [1]
    assert await s.ids() == {2}


async def test_operator_pause_on_a_controller_managed_coordinator_is_refused_and_changes_nothing(
    coord: tuple[Coordinator, Stubs],
) -> None:
    _, s = coord
    await s.set(P, D, generation=4)  # as the controller pushes: a tracked generation
    for call in (s.registry.PauseInstances(cpb.PauseInstancesRequest(instance_ids=[1]), metadata=MD, timeout=5),
                 s.registry.ResumeInstances(cpb.ResumeInstancesRequest(instance_ids=[1]), metadata=MD, timeout=5)):
        err = await expect(grpc.StatusCode.FAILED_PRECONDITION, call, "MANAGED_BY_CONTROLLER")
        assert "managed by a controller" in (err.details() or "")
    resp = await s.list()
    assert resp.generation == 4 and resp.summary.paused == 0
    # The controller's tracked pause is applied.
    await s.registry.PauseInstances(cpb.PauseInstancesRequest(instance_ids=[1], generation=5), metadata=MD, timeout=5)
    assert (await s.list()).summary.paused == 1


async def test_pause_resume_list_summary_get_and_not_found(coord: tuple[Coordinator, Stubs]) -> None:
    _, s = coord
    await s.set(P, D, U, inst(5, Role.PREFILL))
    await s.registry.PauseInstances(cpb.PauseInstancesRequest(instance_ids=[1, 3]), metadata=MD, timeout=5)
    await expect(grpc.StatusCode.NOT_FOUND,
                 s.registry.PauseInstances(cpb.PauseInstancesRequest(instance_ids=[2, 99]), metadata=MD, timeout=5))
    await expect(grpc.StatusCode.NOT_FOUND,
                 s.registry.ResumeInstances(cpb.ResumeInstancesRequest(instance_ids=[99]), metadata=MD, timeout=5))
    resp = await s.list()
    assert (resp.summary.available, resp.summary.paused, resp.summary.unavailable) == (2, 2, 0)
    assert (resp.summary.prefill, resp.summary.decode, resp.summary.union_instances) == (2, 1, 1)
    got = await s.registry.GetInstance(cpb.GetInstanceRequest(instance_id=1), metadata=MD, timeout=5)
    assert got.instance.status == tpb.INSTANCE_STATUS_PAUSED
    await s.registry.ResumeInstances(cpb.ResumeInstancesRequest(instance_ids=[1]), metadata=MD, timeout=5)
    assert (await s.list()).summary.paused == 1
    await expect(grpc.StatusCode.NOT_FOUND,
                 s.registry.GetInstance(cpb.GetInstanceRequest(instance_id=42), metadata=MD, timeout=5))
    page1 = await s.list(page_size=3)
    page2 = await s.list(page_size=3, page_token=page1.next_page_token)
    assert [i.id for i in page1.instances] + [i.id for i in page2.instances] == [1, 2, 3, 5]
    assert page2.next_page_token == ""
    prefills = await s.list(role=tpb.ROLE_PREFILL)
    assert [i.id for i in prefills.instances] == [1, 5]


async def test_generation_rules_over_grpc(coord: tuple[Coordinator, Stubs]) -> None:
    _, s = coord
    assert (await s.set(P, generation=10)).generation == 10
    await expect(grpc.StatusCode.ABORTED, s.set(D, generation=9), "STALE_GENERATION")
    await expect(grpc.StatusCode.ABORTED, s.add(D, generation=10), "STALE_GENERATION")
    await expect(grpc.StatusCode.FAILED_PRECONDITION, s.add(D, generation=12), "GENERATION_GAP")
    assert await s.ids() == {1}
    assert (await s.add(D, generation=11)).generation == 11
    assert (await s.add(U)).generation == 12  # 0 = unconditional, advances by one
    assert (await s.list()).generation == 12


async def test_if_generation_makes_an_untracked_write_conditional(coord: tuple[Coordinator, Stubs]) -> None:
    app, s = coord
    reg = s.registry
    # a fresh coordinator is at generation 0: the condition holds for 0 (an optional field)
    assert (await reg.SetInstances(cpb.SetInstancesRequest(instances=pbs(P), if_generation=0), metadata=MD,
                                   timeout=5)).generation == 1
    await s.add(D)  # another writer: generation 2
    calls = (
        reg.SetInstances(cpb.SetInstancesRequest(instances=pbs(U), if_generation=1), metadata=MD, timeout=5),
        reg.AddInstances(cpb.AddInstancesRequest(instances=pbs(U), if_generation=1), metadata=MD, timeout=5),
        reg.DeleteInstances(cpb.DeleteInstancesRequest(instances=pbs(P), if_generation=1), metadata=MD, timeout=5),
    )
    for call in calls:
        err = await expect(grpc.StatusCode.ABORTED, call, "GENERATION_CHANGED")
        assert "generation 2" in (err.details() or "") and "list the instances again" in (err.details() or "")
    assert await s.ids() == {1, 2} and (await s.list()).generation == 2  # nothing applied
    await expect(grpc.StatusCode.INVALID_ARGUMENT, reg.AddInstances(
        cpb.AddInstancesRequest(instances=pbs(U), generation=3, if_generation=2), metadata=MD, timeout=5),
        "CONFLICTING_GENERATIONS")
    await expect(grpc.StatusCode.INVALID_ARGUMENT, reg.AddInstances(
        cpb.AddInstancesRequest(instances=pbs(U), if_generation=MAX_GENERATION + 1), metadata=MD, timeout=5),
        "OUT_OF_RANGE")
    resp = await reg.AddInstances(cpb.AddInstancesRequest(instances=pbs(U), if_generation=2), metadata=MD, timeout=5)
    assert resp.generation == 3 and await s.ids() == {1, 2, 3}
    # unlike a tracked generation, the condition leaves the registry unmanaged: untracked pause works
    assert not app.state.managed
    await reg.PauseInstances(cpb.PauseInstancesRequest(instance_ids=[3]), metadata=MD, timeout=5)


@pytest.mark.parametrize("generation", [2**64 - 1, 2**63, MAX_GENERATION + 1])
async def test_out_of_range_generation_is_invalid_argument_and_cannot_wedge_the_registry(
    coord: tuple[Coordinator, Stubs], generation: int,
) -> None:
    _, s = coord
    await s.set(P, generation=5)
    for call in (s.set(D, generation=generation), s.add(D, generation=generation),
                 s.delete(P, generation=generation)):
        err = await expect(grpc.StatusCode.INVALID_ARGUMENT, call)
        # > 2^53-1: refused by the chassis' range check of every generation field, before the registry
        assert error_reason(err) == "OUT_OF_RANGE" and f"[0, {MAX_GENERATION}]" in (err.details() or "")
    assert (await s.list()).generation == 5 and await s.ids() == {1}  # nothing applied
    # the highest accepted value: every later mutation is answered, List/GetReadiness keep working
    assert (await s.set(P, generation=MAX_GENERATION)).generation == MAX_GENERATION
    await expect(grpc.StatusCode.FAILED_PRECONDITION, s.add(D), "GENERATION_EXHAUSTED")
    await expect(grpc.StatusCode.INVALID_ARGUMENT, s.add(D, generation=MAX_GENERATION + 1), "OUT_OF_RANGE")
    listed = await s.list()
    assert listed.generation == MAX_GENERATION and [i.id for i in listed.instances] == [1]
    r = await s.readiness()  # (the vLLM prefill alone answers whole: scheduler.prefill_only_fallback)
    assert r.generation == MAX_GENERATION and r.ready and [a.model for a in r.served_alone] == ["m"]
    assert (await s.set(P, generation=MAX_GENERATION)).generation == MAX_GENERATION  # idempotent retry


async def test_registry_is_authoritative_after_the_first_set_or_add(coord: tuple[Coordinator, Stubs]) -> None:
    app, s = coord
    assert not app.state.authoritative
    await expect(grpc.StatusCode.NOT_FOUND, s.delete(P), "INSTANCE_NOT_FOUND")  # a failed call changes nothing
    assert not app.state.authoritative
    await s.add(P)  # standalone: the first `motor register add` makes the registry authoritative
    assert app.state.authoritative and (await s.readiness()).reason != "instance set not received yet"
    await s.delete(P)
    assert app.state.authoritative  # an empty set that was *given* is still authoritative


async def test_readiness_and_health_follow_the_instance_set(coord: tuple[Coordinator, Stubs]) -> None:
    _, s = coord
    health = health_pb2_grpc.HealthStub(s.channel)

    async def serving() -> bool:
        r = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        d = await health.Check(health_pb2.HealthCheckRequest(service=DISPATCH), timeout=5)
        assert r.status == d.status
        return bool(r.status == health_pb2.HealthCheckResponse.SERVING)

    r = await s.readiness()
    assert not r.ready and r.reason == "instance set not received yet"
    assert r.role == cpb.COORDINATOR_ROLE_STANDALONE and r.available_instances == 0
    assert not await serving()
    await s.set(P)  # a vLLM prefill alone: it answers whole (scheduler.prefill_only_fallback), degraded
    r = await s.readiness()
    assert r.ready and r.available_instances == 1
    assert [(a.model, a.role) for a in r.served_alone] == [("m", tpb.ROLE_PREFILL)]
    await s.add(D)
    r = await s.readiness()
    assert r.ready and r.generation == 2 and r.available_instances == 2 and not r.served_alone
    await wait_for(serving, timeout=5, what="SERVING")
    await s.registry.PauseInstances(cpb.PauseInstancesRequest(instance_ids=[1, 2]), metadata=MD, timeout=5)
    r = await s.readiness()
    assert not r.ready and r.available_instances == 0  # the paused ones are not available
    assert r.reason == "no schedulable prefill+decode pair or union instance" and not r.served_alone
    await wait_for(lambda: _not(serving), timeout=5, what="NOT_SERVING")
    await s.set(replace(U, status=InstanceStatus.AVAILABLE))
    assert (await s.readiness()).ready


async def _not(check: object) -> bool:
    return not await check()  # type: ignore[operator]


async def test_list_models_counts_roles(coord: tuple[Coordinator, Stubs]) -> None:
    _, s = coord
    await s.set(P, D, U, inst(6, Role.UNION, model="other"))
    models = (await s.dispatch.ListModels(cpb.ListModelsRequest(), timeout=5)).models
    assert [(m.id, m.prefill_instances, m.decode_instances, m.union_instances) for m in models] == [
        ("m", 1, 1, 1), ("other", 0, 0, 1)]
    assert all(m.created > 0 for m in models)
