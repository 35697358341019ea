"""Clients for the controller's peers, behind small Protocols (tests substitute fakes).

gRPC errors are translated at this boundary (``motor_common.grpc_client.translate``); every call
has a timeout. The management key from ``server.management_key_file`` is the fleet's key.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Protocol

import grpc

from motor_common.channel_pool import ChannelPool
from motor_common.convert import instance_from_pb, instance_to_pb
from motor_common.credentials import Credential
from motor_common.domain import Instance
from motor_common.errors import Unavailable
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2 as npb
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2_grpc as ngrpc
from motor_common.grpc_client import call_metadata, open_channel, translate
from motor_common.tls import TlsConfig
from motor_controller.assembly import StartCommand
from motor_controller.convert import node_status_from_pb, start_request
from motor_controller.model import NodeStatus
from motor_controller.push_plan import Op, OpKind


class NodeManagers(Protocol):
    async def start_engines(self, cmd: StartCommand) -> None: ...
    async def stop_node(self, address: str, reason: str) -> None: ...
    async def get_status(self, address: str) -> NodeStatus: ...
    async def restart_engine(self, address: str, instance_id: int, *, abort: bool, timeout: float) -> int:
        """RestartEngine(RESTART|ABORT); returns the node's relaunch count."""
        ...

    async def close(self) -> None: ...


class CoordinatorClient(Protocol):
    address: str
    epoch: int  # how many times the client re-opened its connection

    async def apply(self, op: Op) -> int: ...
    async def list_instances(self) -> tuple[int, dict[int, Instance]]: ...
    async def clear_precision_alarms(self, instance_ids: Sequence[int]) -> None: ...
    async def master_address(self) -> str | None:
        """The address this coordinator announces, when it says it is master (its open
        GetReadiness); None when it is not master or does not answer."""
        ...

    def reconnect(self) -> None:
        """Drop the current connection (it may be pinned to a frozen or demoted coordinator)."""
        ...

    async def close(self) -> None: ...


class GrpcNodeManagers:
    """One channel per nodemanager address, opened lazily and closed once idle (a rescheduled
    node's old address is not kept open for the life of the controller)."""

    def __init__(self, management_key: Credential, timeout: float, tls: TlsConfig | None = None,
                 pool: ChannelPool | None = None) -> None:  # fmt: skip
        self._key = management_key
        self._timeout = timeout
        self._pool = pool or ChannelPool(tls)

    @contextlib.asynccontextmanager
    async def _stub(self, address: str) -> AsyncIterator[ngrpc.NodeManagerServiceStub]:
        async with self._pool.channel(address) as ch:
            yield ngrpc.NodeManagerServiceStub(ch)

    async def start_engines(self, cmd: StartCommand) -> None:
        try:
            async with self._stub(cmd.admin_address) as stub:
                await stub.StartEngines(
                    start_request(cmd), metadata=call_metadata(self._key), timeout=self._timeout
                )
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, f"nodemanager {cmd.node_id}@{cmd.admin_address}") from exc

    async def stop_node(self, address: str, reason: str) -> None:
        try:
            async with self._stub(address) as stub:
                await stub.StopNode(
                    npb.StopNodeRequest(reason=reason), metadata=call_metadata(self._key), timeout=self._timeout
                )
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, f"nodemanager {address}") from exc

    async def get_status(self, address: str) -> NodeStatus:
        try:
            async with self._stub(address) as stub:
                resp = await stub.GetStatus(
                    npb.GetStatusRequest(), metadata=call_metadata(self._key), timeout=self._timeout
                )
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, f"nodemanager {address}") from exc
        return node_status_from_pb(resp)

    async def restart_engine(self, address: str, instance_id: int, *, abort: bool, timeout: float) -> int:
        action = npb.RESTART_ACTION_ABORT if abort else npb.RESTART_ACTION_RESTART
        try:
            async with self._stub(address) as stub:
                resp = await stub.RestartEngine(
                    npb.RestartEngineRequest(action=action, instance_id=instance_id),
                    metadata=call_metadata(self._key),
                    timeout=timeout,
                )
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, f"nodemanager {address}") from exc
        return int(resp.relaunch_count)

    async def close(self) -> None:
        await self._pool.close()


class GrpcCoordinator:
    """InstanceRegistryService of one coordinator, over its own channel.

    :meth:`reconnect` swaps in a fresh channel and closes the old one in the background (its
    in-flight calls are cancelled): no keep-alive connection stays pinned to a coordinator that
    froze or lost the lock, even behind a Service address. ``epoch`` counts the swaps so a caller
    can tell a failure caused by the swap from a real one."""

    def __init__(self, address: str, management_key: Credential, timeout: float,
                 tls: TlsConfig | None = None) -> None:
        self.address = address
        self._tls = tls
        self._key = management_key
        self._timeout = timeout
        self.epoch = 0
        self._closing: set[asyncio.Task[None]] = set()
        self._open()

    def _open(self) -> None:
        self._channel = open_channel(self.address, tls=self._tls)
        self._stub = cgrpc.InstanceRegistryServiceStub(self._channel)

    def reconnect(self) -> None:
        old = self._channel
        self._open()
        self.epoch += 1
        task = asyncio.get_running_loop().create_task(old.close(), name=f"close-channel:{self.address}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """gRPC errors as MotorErrors. A call cut short by :meth:`reconnect` closing its channel
        surfaces from grpc.aio as ``CancelledError`` although *our* task was not cancelled: that is
        a failed call (UNAVAILABLE), not a cancellation, or it would silently end the caller's loop."""
        try:
            yield
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, f"coordinator {self.address}") from exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise
            raise Unavailable(
                f"coordinator {self.address}: call cut short because the connection was re-opened",
                reason="CONNECTION_REOPENED",
            ) from None

    async def apply(self, op: Op) -> int:
        insts = [instance_to_pb(i) for i in op.instances]
        ids = [i.id for i in op.instances]
        md = call_metadata(self._key)
        with self._errors():
            if op.kind is OpKind.SET:
                r1 = await self._stub.SetInstances(
                    cpb.SetInstancesRequest(instances=insts, generation=op.generation), metadata=md, timeout=self._timeout
                )
                return int(r1.generation)
            if op.kind is OpKind.ADD:
                r2 = await self._stub.AddInstances(
                    cpb.AddInstancesRequest(instances=insts, generation=op.generation), metadata=md, timeout=self._timeout
                )
                return int(r2.generation)
            if op.kind is OpKind.DEL:
                r3 = await self._stub.DeleteInstances(
                    cpb.DeleteInstancesRequest(instances=insts, generation=op.generation), metadata=md, timeout=self._timeout
                )
                return int(r3.generation)
            if op.kind is OpKind.PAUSE:
                r4 = await self._stub.PauseInstances(
                    cpb.PauseInstancesRequest(instance_ids=ids, generation=op.generation), metadata=md, timeout=self._timeout
                )
                return int(r4.generation)
            r5 = await self._stub.ResumeInstances(
                cpb.ResumeInstancesRequest(instance_ids=ids, generation=op.generation), metadata=md, timeout=self._timeout
            )
            return int(r5.generation)

    async def list_instances(self) -> tuple[int, dict[int, Instance]]:
        out: dict[int, Instance] = {}
        token = ""
        generation = 0
        with self._errors():
            while True:
                resp = await self._stub.ListInstances(
                    cpb.ListInstancesRequest(page_size=1000, page_token=token),
                    metadata=call_metadata(self._key),
                    timeout=self._timeout,
                )
                generation = int(resp.generation)
                for msg in resp.instances:
                    inst = instance_from_pb(msg)
                    out[inst.id] = inst
                token = resp.next_page_token
                if not token:
                    return generation, out

    async def clear_precision_alarms(self, instance_ids: Sequence[int]) -> None:
        with self._errors():
            await self._stub.ClearPrecisionAlarms(
                cpb.ClearPrecisionAlarmsRequest(instance_ids=list(instance_ids)),
                metadata=call_metadata(self._key),
                timeout=self._timeout,
            )

    async def master_address(self) -> str | None:
        try:  # GetReadiness is open: no key is sent
            resp = await cgrpc.DispatchServiceStub(self._channel).GetReadiness(
                cpb.GetReadinessRequest(), metadata=call_metadata(), timeout=self._timeout)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            return None
        if resp.role != cpb.COORDINATOR_ROLE_MASTER:
            return None
        # A coordinator from before the field: it can only vouch for its configured address.
        return resp.advertise_address or self.address

    async def close(self) -> None:
        await self._channel.close()
        if self._closing:
            await asyncio.wait(list(self._closing), timeout=self._timeout)
