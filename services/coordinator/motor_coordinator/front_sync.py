"""The coordinator's side of its front workers' sync stream (``http.workers`` > 1).

``FrontWorkerService/Sync`` is served on a unix socket in the coordinator's private directory
(``FrontSyncServer``). Each worker's stream gets the instance set, leadership and precision
alarms in full first, then each part whenever it changes. Sends are coalesced: a part that changed
several times while the previous message was being written goes out once, as it is now. (The
workers' load goes over the shared-memory board, ``load_board.py``, not this stream.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from motor_common.convert import instance_to_pb
from motor_common.gen.motor.coordinator.v1 import front_worker_pb2 as fpb
from motor_common.gen.motor.coordinator.v1 import front_worker_pb2_grpc as fgrpc
from motor_coordinator.dispatch_service import ROLE_TO_PB
from motor_coordinator.leadership import Leadership
from motor_coordinator.precision import Group
from motor_coordinator.registry import RegistryState

log = logging.getLogger(__name__)

ROLE_FROM_PB = {v: k for k, v in ROLE_TO_PB.items()}
SOCKET_NAME = "sync.sock"
# The largest message on the stream: a registry of many instances (the chassis' own bound is 4 MiB).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def registry_to_pb(state: RegistryState) -> fpb.FrontWorkerRegistry:
    return fpb.FrontWorkerRegistry(generation=state.generation,
                                   instances=[instance_to_pb(i) for i in state.instances.values()],
                                   authoritative=state.authoritative, managed=state.managed)


def leadership_to_pb(lead: Leadership) -> fpb.FrontWorkerLeadership:
    return fpb.FrontWorkerLeadership(role=ROLE_TO_PB[lead.role], isolated=lead.isolated,
                                     store_available=lead.store_available, master_valid_until=lead.valid_until)


def alarms_to_pb(groups: frozenset[Group]) -> fpb.FrontWorkerAlarms:
    return fpb.FrontWorkerAlarms(groups=[fpb.PrecisionGroup(instance_ids=list(g)) for g in sorted(groups)])


@dataclass
class _Stream:
    """What one worker's stream still has to send."""

    worker: int = -1
    registry: bool = True
    leadership: bool = True
    alarms: bool = True
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def due(self) -> bool:
        return self.registry or self.leadership or self.alarms


class FrontSync:
    """The hub: the coordinator calls ``*_changed``; every open stream is due that part."""

    def __init__(self, state: Callable[[], RegistryState], leadership: Leadership,
                 alarmed: Callable[[], frozenset[Group]]) -> None:
        self._state = state
        self._leadership = leadership
        self._alarmed = alarmed
        self._streams: list[_Stream] = []
        # Called with a worker's index when its stream ended (it died: its load must not count).
        self.on_worker_gone: Callable[[int], None] | None = None

    @property
    def workers(self) -> int:
        """Open worker streams."""
        return len(self._streams)

    def _mark(self, part: str) -> None:
        for s in self._streams:
            setattr(s, part, True)
            s.wake.set()

    def registry_changed(self) -> None:
        self._mark("registry")

    def leadership_changed(self) -> None:
        self._mark("leadership")

    def alarms_changed(self) -> None:
        self._mark("alarms")

    def hello(self, stream: _Stream, msg: fpb.SyncRequest) -> None:
        stream.worker = msg.worker_index

    def message(self, stream: _Stream) -> fpb.SyncResponse:
        """What *stream* is due now (its flags cleared)."""
        out = fpb.SyncResponse()
        if stream.registry:
            out.registry.CopyFrom(registry_to_pb(self._state()))
        if stream.leadership:
            out.leadership.CopyFrom(leadership_to_pb(self._leadership))
        if stream.alarms:
            out.alarms.CopyFrom(alarms_to_pb(self._alarmed()))
        stream.registry = stream.leadership = stream.alarms = False
        return out

    async def serve(self, requests: AsyncIterator[fpb.SyncRequest]) -> AsyncIterator[fpb.SyncResponse]:
        stream = _Stream()
        self._streams.append(stream)

        async def read() -> None:
            async for msg in requests:
                self.hello(stream, msg)

        reader = asyncio.ensure_future(read())
        try:
            while True:
                if not stream.due():
                    stream.wake.clear()
                    waiter = asyncio.ensure_future(stream.wake.wait())
                    done, _ = await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
                    if reader in done:  # the worker closed its side (or it broke): the stream ends
                        waiter.cancel()
                        reader.result()
                        return
                    continue
                yield self.message(stream)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            self._streams.remove(stream)
            if stream.worker >= 0 and self.on_worker_gone is not None:
                self.on_worker_gone(stream.worker)
            log.info("front worker sync stream ended", extra={"worker": stream.worker})


class _Servicer(fgrpc.FrontWorkerServiceServicer):
    def __init__(self, sync: FrontSync) -> None:
        self.sync = sync

    async def Sync(self, request_iterator: AsyncIterator[fpb.SyncRequest],
                   context: Any) -> AsyncIterator[fpb.SyncResponse]:
        async for msg in self.sync.serve(request_iterator):
            yield msg


class FrontSyncServer:
    """``FrontWorkerService`` on ``unix:<directory>/sync.sock`` (the directory is the caller's,
    mode 0700: only this user can connect)."""

    def __init__(self, sync: FrontSync, directory: str) -> None:
        self.path = os.path.join(directory, SOCKET_NAME)
        self._server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)])
        fgrpc.add_FrontWorkerServiceServicer_to_server(_Servicer(sync), self._server)
        self._server.add_insecure_port(f"unix:{self.path}")

    @property
    def target(self) -> str:
        return f"unix:{self.path}"

    async def start(self) -> None:
        await self._server.start()

    async def stop(self, grace: float = 1.0) -> None:
        await self._server.stop(grace)
