"""gRPC server reflection, both versions (``grpc.reflection.v1`` and ``v1alpha``), serving Motor's
descriptors with their source comments.

grpcio-reflection only registers v1alpha and serves descriptors copied from the runtime pool, which
drops comments. Here the Motor files come from ``motor_common/gen/motor.binpb`` (written by
scripts/gen_protos.py with ``--include_source_info``), every other file (google/protobuf, health,
reflection) from the runtime pool. The two protocol versions are wire-identical (same messages,
same field numbers; only the package differs), so one implementation answers both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from importlib import resources
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection_pb2 as rpb

V1 = "grpc.reflection.v1.ServerReflection"
V1ALPHA = "grpc.reflection.v1alpha.ServerReflection"
SERVICE_NAMES = (V1, V1ALPHA)
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _source_files() -> dict[str, descriptor_pb2.FileDescriptorProto]:
    data = resources.files("motor_common.gen").joinpath("motor.binpb").read_bytes()
    fds = descriptor_pb2.FileDescriptorSet.FromString(data)
    return {f.name: f for f in fds.file}


def _v1_file() -> descriptor_pb2.FileDescriptorProto:
    """grpc/reflection/v1/reflection.proto, derived from the v1alpha file (same messages)."""
    fdp = descriptor_pb2.FileDescriptorProto()
    rpb.DESCRIPTOR.CopyToProto(fdp)
    fdp.name = _V1_FILE
    fdp.package = "grpc.reflection.v1"
    fdp.ClearField("options")
    for service in fdp.service:
        for method in service.method:
            method.input_type = method.input_type.replace(".v1alpha.", ".v1.")
            method.output_type = method.output_type.replace(".v1alpha.", ".v1.")
    for message in fdp.message_type:
        for field in message.field:
            field.type_name = field.type_name.replace(".v1alpha.", ".v1.")
    return fdp


class ReflectionIndex:
    """File descriptors and the symbol → file map for the services a server exposes."""

    def __init__(self, service_names: Iterable[str]) -> None:
        pool = descriptor_pool.Default()
        with_comments = _source_files()
        self.files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
        self.services = tuple(sorted({*service_names, *SERVICE_NAMES}))
        for name in self.services:
            if name == V1:
                continue
            self._add(pool.FindFileContainingSymbol(name), with_comments)
        self.files[_V1_FILE] = _v1_file()
        self.symbols: dict[str, str] = {}
        for fdp in self.files.values():
            self._index(fdp)

    def _add(self, fd: Any, with_comments: dict[str, descriptor_pb2.FileDescriptorProto]) -> None:
        if fd.name in self.files:
            return
        if fd.name in with_comments:
            self.files[fd.name] = with_comments[fd.name]
        else:
            fdp = descriptor_pb2.FileDescriptorProto()
            fd.CopyToProto(fdp)
            self.files[fd.name] = fdp
        for dep in fd.dependencies:
            self._add(dep, with_comments)

    def _index(self, fdp: descriptor_pb2.FileDescriptorProto) -> None:
        prefix = f"{fdp.package}." if fdp.package else ""

        def message(scope: str, m: descriptor_pb2.DescriptorProto) -> None:
            name = scope + m.name
            self.symbols[name] = fdp.name
            for f in m.field:
                self.symbols[f"{name}.{f.name}"] = fdp.name
            for e in m.enum_type:
                self.symbols[f"{name}.{e.name}"] = fdp.name
            for nested in m.nested_type:
                message(name + ".", nested)

        for m in fdp.message_type:
            message(prefix, m)
        for e in fdp.enum_type:
            self.symbols[prefix + e.name] = fdp.name
            for v in e.value:
                self.symbols[prefix + v.name] = fdp.name
        for s in fdp.service:
            self.symbols[prefix + s.name] = fdp.name
            for method in s.method:
                self.symbols[f"{prefix}{s.name}.{method.name}"] = fdp.name

    def closure(self, name: str) -> list[bytes]:
        """The file *name* first, then its transitive dependencies, serialized."""
        order: list[str] = []

        def visit(n: str) -> None:
            if n in order or n not in self.files:
                return
            order.append(n)
            for dep in self.files[n].dependency:
                visit(dep)

        visit(name)
        return [self.files[n].SerializeToString() for n in order]

    def answer(self, request: rpb.ServerReflectionRequest) -> rpb.ServerReflectionResponse:
        which = request.WhichOneof("message_request")
        response = rpb.ServerReflectionResponse(valid_host=request.host, original_request=request)
        if which == "list_services":
            response.list_services_response.service.extend(rpb.ServiceResponse(name=n) for n in self.services)
        elif which == "file_by_filename" and request.file_by_filename in self.files:
            response.file_descriptor_response.file_descriptor_proto.extend(self.closure(request.file_by_filename))
        elif which == "file_containing_symbol" and request.file_containing_symbol in self.symbols:
            file = self.symbols[request.file_containing_symbol]
            response.file_descriptor_response.file_descriptor_proto.extend(self.closure(file))
        elif which == "all_extension_numbers_of_type" and request.all_extension_numbers_of_type in self.symbols:
            # No Motor message declares extension ranges.
            response.all_extension_numbers_response.base_type_name = request.all_extension_numbers_of_type
        elif which is None:
            response.error_response.error_code = grpc.StatusCode.INVALID_ARGUMENT.value[0]
            response.error_response.error_message = "empty reflection request"
        else:
            response.error_response.error_code = grpc.StatusCode.NOT_FOUND.value[0]
            response.error_response.error_message = f"not found: {which}"
        return response


def add_reflection(server: grpc.aio.Server, service_names: Iterable[str]) -> ReflectionIndex:
    """Registers reflection v1 and v1alpha on *server* for *service_names* (plus reflection itself)."""
    index = ReflectionIndex(service_names)

    async def info(requests: AsyncIterator[rpb.ServerReflectionRequest],
                   _context: grpc.aio.ServicerContext) -> AsyncIterator[rpb.ServerReflectionResponse]:
        async for request in requests:
            yield index.answer(request)

    for service in SERVICE_NAMES:
        handler = grpc.stream_stream_rpc_method_handler(
            info,
            request_deserializer=rpb.ServerReflectionRequest.FromString,
            response_serializer=rpb.ServerReflectionResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {"ServerReflectionInfo": handler}),))
    return index
