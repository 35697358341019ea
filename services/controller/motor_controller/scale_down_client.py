"""gRPC client of the nodemanagers' ``ScaleDownService`` (errors translated, every call timed out)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import grpc

from motor_common.channel_pool import ChannelPool
from motor_common.credentials import Credential
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as npb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2_grpc as ngrpc
from motor_common.grpc_client import call_metadata, translate
from motor_common.tls import TlsConfig

_STATES = {
    npb.SCALE_DOWN_STATE_DISABLED: "disabled",
    npb.SCALE_DOWN_STATE_IDLE: "idle",
    npb.SCALE_DOWN_STATE_GUARDED: "guarded",
    npb.SCALE_DOWN_STATE_APPLYING: "applying",
    npb.SCALE_DOWN_STATE_HEALTHY: "healthy",
    npb.SCALE_DOWN_STATE_UNHEALTHY: "unhealthy",
}


class GrpcScaleDown:
    """The nodemanagers' ScaleDownService, on a pool of channels closed once idle (shared with
    :class:`~motor_controller.peers.GrpcNodeManagers` when both are given the same pool)."""

    def __init__(self, management_key: Credential, tls: TlsConfig | None = None,
                 pool: ChannelPool | None = None) -> None:  # fmt: skip
        self._key = management_key
        self._pool = pool or ChannelPool(tls)

    @asynccontextmanager
    async def _stub(self, address: str) -> AsyncIterator[ngrpc.ScaleDownServiceStub]:
        async with self._pool.channel(address) as ch:
            yield ngrpc.ScaleDownServiceStub(ch)

    async def guard(self, address: str, request_id: str, instance_id: int, lease_sec: float,
                    dead_ranks: Sequence[int], *, timeout: float) -> None:  # fmt: skip
        req = npb.GuardScaleDownRequest(request_id=request_id, instance_id=instance_id, lease_seconds=lease_sec,
                                        dead_dp_ranks=list(dead_ranks))  # fmt: skip
        try:
            async with self._stub(address) as stub:
                await stub.GuardScaleDown(req, metadata=call_metadata(self._key), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, f"nodemanager {address}") from exc

    async def apply(self, address: str, request_id: str, instance_id: int, dead_ranks: Sequence[int], *,
                    timeout: float) -> None:  # fmt: skip
        req = npb.ApplyScaleDownRequest(request_id=request_id, instance_id=instance_id, dead_dp_ranks=list(dead_ranks))
        try:
            async with self._stub(address) as stub:
                await stub.ApplyScaleDown(req, metadata=call_metadata(self._key), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, f"nodemanager {address}") from exc

    async def finalize(self, address: str, request_id: str, instance_id: int, *, commit: bool,
                       timeout: float) -> list[int]:  # fmt: skip
        decision = npb.SCALE_DOWN_DECISION_COMMIT if commit else npb.SCALE_DOWN_DECISION_ABORT
        req = npb.FinalizeScaleDownRequest(request_id=request_id, instance_id=instance_id, decision=decision)
        try:
            async with self._stub(address) as stub:
                resp = await stub.FinalizeScaleDown(req, metadata=call_metadata(self._key), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, f"nodemanager {address}") from exc
        return list(resp.retired_dp_ranks)

    async def status(self, address: str, *, timeout: float) -> str:
        try:
            async with self._stub(address) as stub:
                resp = await stub.GetScaleDownStatus(
                    npb.GetScaleDownStatusRequest(), metadata=call_metadata(self._key), timeout=timeout
                )
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, f"nodemanager {address}") from exc
        return _STATES.get(resp.state, "unspecified")

    async def close(self) -> None:
        await self._pool.close()
