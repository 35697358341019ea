"""What the serving coordinators of a fleet say is served by one side of its prefill/decode pair
alone (``GetReadinessResponse.served_alone``: no prefill, or no decode, schedulable for a model;
its requests are answered whole by the other side, slower). ``motor up`` is ready only when no
model is, and says so while one is."""

from __future__ import annotations

import grpc

from motor_common.gen.motor.common.v1 import types_pb2 as tpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_client import open_channel
from motor_common.tls import TlsConfig

_SERVING = (cpb.COORDINATOR_ROLE_MASTER, cpb.COORDINATOR_ROLE_STANDALONE)
_SIDE = {tpb.ROLE_PREFILL: "prefill", tpb.ROLE_DECODE: "decode"}


async def served_alone(addresses: list[str], tls: TlsConfig | None = None, timeout: float = 2.0) -> list[str]:
    """``"<model> (by its <role>s alone)"`` for each model a ready, serving coordinator serves so;
    coordinators that cannot be asked are skipped (the gateway's readiness covers them)."""
    out: set[str] = set()
    for address in addresses:
        try:
            async with open_channel(address, tls=tls) as channel:
                r = await cgrpc.DispatchServiceStub(channel).GetReadiness(cpb.GetReadinessRequest(), timeout=timeout)
        except grpc.aio.AioRpcError:
            continue
        if r.ready and r.role in _SERVING:
            out.update(f"{a.model} (by its {_SIDE.get(a.role, 'instance')}s alone)" for a in r.served_alone)
    return sorted(out)
