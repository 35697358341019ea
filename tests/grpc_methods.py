"""Every gRPC method of Motor's protos, callable generically (security and fuzz tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor, message_factory

from motor_common.gen.motor.controller.v1 import controller_pb2
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2

FILES = {"controller": controller_pb2.DESCRIPTOR, "coordinator": coordinator_pb2.DESCRIPTOR,
         "nodemanager": nodemanager_pb2.DESCRIPTOR}


@dataclass(frozen=True)
class Method:
    program: str
    service: str  # full name
    name: str
    desc: descriptor.MethodDescriptor

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"

    @property
    def request_class(self) -> Any:
        return message_factory.GetMessageClass(self.desc.input_type)

    @property
    def id(self) -> str:
        return f"{self.service.rsplit('.', 1)[-1]}.{self.name}"

    async def call(self, channel: grpc.aio.Channel, request: Any, metadata: Sequence[tuple[str, str]] = (),
                   timeout: float = 5.0) -> list[Any]:
        """Send *request* (one message; a one-message stream for client streaming) and collect the
        responses (at most 3 of a server stream). A client-streaming call whose message send raced
        the server's refusal ends with grpc's *local* INTERNAL "Internal error from Core" instead of
        the server's status (seen once in ~1,400 calls, and three times in a row on a loaded CI
        box): such a call is made again, and the third time without sending its message, so only
        the server's status can end it (a server that refuses by metadata answers at once; one that
        waits for the message runs into *timeout*)."""
        for attempt in range(3):
            try:
                return await self._call(channel, request, metadata, timeout, send=attempt < 2)
            except grpc.aio.AioRpcError as exc:
                local = exc.code() is grpc.StatusCode.INTERNAL and "Internal error from Core" in (exc.details() or "")
                if not (self.desc.client_streaming and local) or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _call(self, channel: grpc.aio.Channel, request: Any, metadata: Sequence[tuple[str, str]],
                    timeout: float, send: bool = True) -> list[Any]:
        resp_cls = message_factory.GetMessageClass(self.desc.output_type)
        ser, des = type(request).SerializeToString, resp_cls.FromString
        cs, ss = self.desc.client_streaming, self.desc.server_streaming
        if not cs and not ss:
            return [await channel.unary_unary(self.path, ser, des)(request, metadata=metadata, timeout=timeout)]
        if cs:
            # Written by hand, not from a request iterator: a server that refuses the call (bad
            # credentials) may end it before the message is sent, and grpc's iterator consumer then
            # surfaces a local INTERNAL "Internal error from Core" instead of the server's status.
            call: Any = (channel.stream_stream if ss else channel.stream_unary)(self.path, ser, des)(
                metadata=metadata, timeout=timeout)
            try:
                if send:
                    await call.write(request)
                    await call.done_writing()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                pass  # the call already ended: its status (the server's) is raised below
        else:
            call = channel.unary_stream(self.path, ser, des)(request, metadata=metadata, timeout=timeout)
        if not ss:
            return [await call]
        out = []
        try:
            async for item in call:
                out.append(item)
                if len(out) >= 3:
                    break
        finally:
            call.cancel()
        return out


def methods(program: str) -> list[Method]:
    out = []
    for svc in FILES[program].services_by_name.values():
        for m in svc.methods:
            out.append(Method(program, svc.full_name, m.name, m))
    return out
