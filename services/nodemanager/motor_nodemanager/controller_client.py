"""The controller as this node sees it: registration, the heartbeat stream, fault reports.

:class:`ControllerPeer` is the Protocol the rest of the package uses; :class:`GrpcController` is the
gRPC implementation (the only module here that touches ``controller_pb2``). gRPC failures are
translated into :mod:`motor_common.errors` at this boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import grpc
from google.protobuf import timestamp_pb2

from motor_common.convert import endpoint_health_to_pb, node_spec_to_pb
from motor_common.credentials import Credential
from motor_common.domain import EndpointHealth, NodeSpec
from motor_common.errors import DeadlineExceeded, MotorError, Unavailable
from motor_common.gen.motor.controller.v1 import controller_pb2 as cpb
from motor_common.gen.motor.controller.v1 import controller_pb2_grpc as cgrpc
from motor_common.grpc_client import call_metadata, open_channel, translate
from motor_common.tls import TlsConfig
from motor_nodemanager.controller_reopen import CONNECTION_REOPENED, ReopenPolicy
from motor_nodemanager.detail import clip

log = logging.getLogger(__name__)


class NodeState(enum.Enum):
    UNSPECIFIED = cpb.NODE_STATE_UNSPECIFIED
    REGISTERED = cpb.NODE_STATE_REGISTERED
    STARTING = cpb.NODE_STATE_STARTING
    RUNNING = cpb.NODE_STATE_RUNNING
    PAUSED = cpb.NODE_STATE_PAUSED
    RELAUNCHING = cpb.NODE_STATE_RELAUNCHING
    STOPPING = cpb.NODE_STATE_STOPPING
    RESTORED = cpb.NODE_STATE_RESTORED


@dataclass(frozen=True)
class Registration:
    node_id: str
    heartbeat_interval_seconds: float
    controller_epoch: str


@dataclass(frozen=True)
class HeartbeatFrame:
    node_id: str
    state: NodeState
    instance_id: int
    endpoints: tuple[EndpointHealth, ...]
    relaunch_count: int = 0
    sent_at: float = field(default_factory=time.time)


class AckCommand(enum.Enum):
    NONE = "none"
    REREGISTER = "reregister"


@dataclass(frozen=True)
class Ack:
    sequence: int
    command: AckCommand
    message: str = ""


class FaultLevel(enum.Enum):
    ENGINE_UNHEALTHY = cpb.FAULT_LEVEL_ENGINE_UNHEALTHY
    ENGINE_DEAD = cpb.FAULT_LEVEL_ENGINE_DEAD


class FaultSource(enum.Enum):
    PROCESS_EXIT = cpb.FAULT_SOURCE_PROCESS_EXIT
    HEALTH_PROBE = cpb.FAULT_SOURCE_HEALTH_PROBE
    ENGINE_PUBLISHER = cpb.FAULT_SOURCE_ENGINE_PUBLISHER


@dataclass(frozen=True)
class FaultReport:
    node_id: str
    instance_id: int
    endpoint_id: int
    level: FaultLevel
    source: FaultSource
    pid: int = 0
    detail: str = ""


@dataclass(frozen=True)
class FaultAck:
    accepted: bool
    relaunch_expected: bool


class ControllerPeer(Protocol):
    # Controller addresses tried in turn (HA controllers); the heartbeat back-off grows per round.
    addresses: list[str]

    async def register(self, spec: NodeSpec, timeout: float) -> Registration: ...

    async def report_fault(self, report: FaultReport, timeout: float) -> FaultAck: ...

    def heartbeat(self, frames: AsyncIterator[HeartbeatFrame]) -> AsyncIterator[Ack]: ...

    async def close(self) -> None: ...


def timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


class GrpcController:
    """ControllerService over one channel per address (streams are re-opened by callers).

    *address* may be a comma-separated list (HA controllers: only the master accepts calls, the
    others answer UNAVAILABLE ``NOT_MASTER``): a call that fails UNAVAILABLE or DEADLINE_EXCEEDED
    moves the next call to the next address. A channel whose calls are refused ``NOT_MASTER``, or
    keep failing, is replaced by a new one (:class:`~motor_nodemanager.controller_reopen.ReopenPolicy`:
    with back-off), so a connection pinned behind a Service address to a demoted controller is
    given up and the new connection reaches the pod that is master now. The old channel is closed
    in the background; calls still open on it end as UNAVAILABLE ``CONNECTION_REOPENED``."""

    def __init__(self, address: str, management_key: Credential, *, tls: TlsConfig | None = None,
                 tls_ca_file: str | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.addresses = [a.strip() for a in address.split(",") if a.strip()] or [address]
        self.address = self.addresses[0]
        self._key = management_key
        self._tls = tls
        self._tls_ca_file = tls_ca_file
        self._clock = clock
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, cgrpc.ControllerServiceStub] = {}
        self._reopen = {a: ReopenPolicy() for a in self.addresses}
        self._closing: set[asyncio.Task[None]] = set()
        self.reopened = 0  # channels replaced so far
        for a in self.addresses:
            self._open(a)

    def _open(self, address: str) -> None:
        self._channels[address] = open_channel(address, tls=self._tls, tls_ca_file=self._tls_ca_file)
        self._stubs[address] = cgrpc.ControllerServiceStub(self._channels[address])

    def _reconnect(self, address: str, cause: MotorError) -> None:
        old = self._channels[address]
        self._open(address)
        self.reopened += 1
        log.warning("re-opening the connection to controller %s (%s): %s", address, cause.reason, cause.message)
        task = asyncio.get_running_loop().create_task(old.close(), name=f"close-channel:{address}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _failed(self, address: str, exc: grpc.aio.AioRpcError) -> MotorError:
        err = translate(exc, f"controller {address}")
        if isinstance(err, Unavailable | DeadlineExceeded):
            if self._reopen[address].failed(err.reason, self._clock()):
                self._reconnect(address, err)
            if len(self.addresses) > 1 and self.address == address:
                self.address = self.addresses[(self.addresses.index(address) + 1) % len(self.addresses)]
        return err

    @contextlib.contextmanager
    def _errors(self, address: str, what: str) -> Iterator[None]:
        """gRPC errors as MotorErrors. A call cut short by the closing of its channel (our own
        re-open, or a rotated client certificate's drained channel past its drain time) surfaces from
        grpc.aio as ``CancelledError`` although this task was not cancelled: a failed call to retry
        (UNAVAILABLE ``CONNECTION_REOPENED``), not a cancellation that would end the caller's loop."""
        try:
            yield
        except grpc.aio.AioRpcError as exc:
            raise self._failed(address, exc) from exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise
            raise Unavailable(f"controller {address}: {what} cut short by a closed channel",
                              reason=CONNECTION_REOPENED) from None

    async def register(self, spec: NodeSpec, timeout: float) -> Registration:
        address = self.address
        with self._errors(address, "registration"):
            resp = await self._stubs[address].RegisterNode(
                cpb.RegisterNodeRequest(node=node_spec_to_pb(spec)), metadata=call_metadata(self._key), timeout=timeout
            )
        self._reopen[address].succeeded()
        return Registration(resp.node_id or spec.node_id, resp.heartbeat_interval_seconds, resp.controller_epoch)

    async def report_fault(self, report: FaultReport, timeout: float) -> FaultAck:
        req = cpb.ReportFaultRequest(
            node_id=report.node_id,
            instance_id=report.instance_id,
            endpoint_id=report.endpoint_id,
            level=report.level.value,
            source=report.source.value,
            pid=report.pid,
            detail=clip(report.detail),  # a backstop: producers clip their own text already
        )
        address = self.address
        with self._errors(address, "fault report"):
            resp = await self._stubs[address].ReportFault(req, metadata=call_metadata(self._key), timeout=timeout)
        self._reopen[address].succeeded()
        return FaultAck(bool(resp.accepted), bool(resp.relaunch_expected))

    async def heartbeat(self, frames: AsyncIterator[HeartbeatFrame]) -> AsyncIterator[Ack]:
        async def requests() -> AsyncIterator[cpb.HeartbeatRequest]:
            seq = 0
            async for f in frames:
                seq += 1
                yield cpb.HeartbeatRequest(
                    node_id=f.node_id,
                    sequence=seq,
                    state=f.state.value,
                    instance_id=f.instance_id,
                    endpoints=[endpoint_health_to_pb(dataclasses.replace(e, detail=clip(e.detail)))
                               for e in f.endpoints],
                    sent_at=timestamp(f.sent_at),
                    relaunch_count=f.relaunch_count,
                )

        address = self.address
        call = self._stubs[address].Heartbeat(requests(), metadata=call_metadata(self._key))
        try:
            with self._errors(address, "heartbeat stream"):
                async for resp in call:
                    self._reopen[address].succeeded()
                    cmd = AckCommand.REREGISTER if resp.command == cpb.HEARTBEAT_COMMAND_REREGISTER else AckCommand.NONE
                    yield Ack(resp.acked_sequence, cmd, resp.message)
        finally:
            call.cancel()

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        for task in list(self._closing):
            with contextlib.suppress(Exception):
                await task
