"""Builders of domain instances for coordinator tests."""

from __future__ import annotations

from motor_common.domain import Endpoint, EngineType, Instance, InstanceStatus, Role


def ep(port: int, ip: str = "127.0.0.1", id: int = 0, bootstrap: int = 0) -> Endpoint:
    return Endpoint(id=id, ip=ip, business_port=port, bootstrap_port=bootstrap)


def inst(
    iid: int,
    role: Role = Role.PREFILL,
    ports: tuple[int, ...] = (),
    *,
    job: str = "job",
    model: str = "m",
    engine: EngineType = EngineType.VLLM,
    status: InstanceStatus = InstanceStatus.AVAILABLE,
    endpoints: tuple[Endpoint, ...] | None = None,
) -> Instance:
    if endpoints is None:
        ports = ports or (10000 + iid,)
        endpoints = tuple(
            ep(p, id=i, bootstrap=(p + 20000 if engine is EngineType.SGLANG and role is Role.PREFILL else 0))
            for i, p in enumerate(ports)
        )
    return Instance(iid, role, job, model, engine, endpoints, status)
