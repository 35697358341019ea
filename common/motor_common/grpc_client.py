"""Client-side gRPC helpers: channels with sane options, metadata, error translation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import grpc

from motor_common import errors
from motor_common.credentials import Credential
from motor_common.grpc_server import MANAGEMENT_KEY_HEADER, REQUEST_ID_HEADER, error_info
from motor_common.logs import request_id_var
from motor_common.reloading_channel import ReloadingChannel
from motor_common.tls import TlsConfig

_OPTIONS: Sequence[tuple[str, int]] = (
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.enable_retries", 0),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    # Each channel its own connections: by default gRPC shares one connection among the channels
    # of a process to the same address, so a new channel opened to give up a connection pinned
    # (behind a Service address) to a demoted or frozen peer would get that same connection back.
    ("grpc.use_local_subchannel_pool", 1),
)


def open_channel(address: str, *, tls: TlsConfig | None = None, tls_ca_file: str | None = None) -> grpc.aio.Channel:
    """An asyncio channel to *address* (``host:port``): TLS when *tls* has a CA (verifying the
    server; its certificate, when set, is presented for mutual TLS) or *tls_ca_file* is given
    (the older, server-only form), else plaintext. A TLS channel re-reads its certificate, key
    and CA files when they change (:class:`~motor_common.reloading_channel.ReloadingChannel`):
    new calls use the new certificate, calls in flight finish on the old connection."""
    if tls_ca_file and not (tls and tls.ca_file):
        tls = replace(tls or TlsConfig(), ca_file=tls_ca_file)
    if tls is not None and tls.dials_tls:
        return ReloadingChannel(address, tls, _OPTIONS)
    return grpc.aio.insecure_channel(address, options=list(_OPTIONS))


def call_metadata(management_key: Credential = None, request_id: str | None = None) -> tuple[tuple[str, str], ...]:
    md: list[tuple[str, str]] = []
    if management_key:
        md.append((MANAGEMENT_KEY_HEADER, str(management_key)))  # a PresentedKey: its current key
    rid = request_id or request_id_var.get()
    if rid:
        md.append((REQUEST_ID_HEADER, rid))
    return tuple(md)


_BY_CODE: dict[grpc.StatusCode, type[errors.MotorError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.ALREADY_EXISTS: errors.AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
    grpc.StatusCode.ABORTED: errors.Aborted,
    grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDenied,
    grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
}


def translate(exc: grpc.aio.AioRpcError, peer: str = "") -> errors.MotorError:
    """Turn a failed call into the matching :class:`MotorError` (use ``raise ... from exc``)."""
    cls = _BY_CODE.get(exc.code(), errors.Unavailable if exc.code() == grpc.StatusCode.CANCELLED else errors.Internal)
    prefix = f"{peer}: " if peer else ""
    info = error_info(exc)
    return cls(f"{prefix}{exc.details() or exc.code().name}", reason=(info.reason if info else None) or exc.code().name,
               metadata=dict(info.metadata) if info and info.metadata else None)
