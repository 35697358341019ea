"""Motor's exception hierarchy, shared by every service.

    MotorError                      base; ``code`` names a canonical gRPC status code
    ├── CallerError                 the caller sent something wrong
    │   ├── InvalidArgument         bad payload (INVALID_ARGUMENT)
    │   ├── NotFound                unknown id or model (NOT_FOUND)
    │   ├── AlreadyExists           same id, different identity (ALREADY_EXISTS)
    │   ├── FailedPrecondition      valid request, wrong state (FAILED_PRECONDITION)
    │   ├── Aborted                 concurrent operation or stale generation (ABORTED)
    │   ├── Unauthenticated         missing/wrong management key (UNAUTHENTICATED)
    │   └── PermissionDenied        (PERMISSION_DENIED)
    ├── PeerError                   a peer (engine, coordinator, nodemanager) failed us
    │   ├── Unavailable             (UNAVAILABLE)
    │   └── DeadlineExceeded        (DEADLINE_EXCEEDED)
    ├── Internal                    our own failure (INTERNAL)
    └── ConfigError                 bad configuration at start-up (never sent on the wire)

This module imports no gRPC: pure decision logic raises these, and the gRPC chassis
(``motor_common.grpc_server``) translates them at the boundary into a status with a
``google.rpc.ErrorInfo`` carrying ``reason`` (UPPER_SNAKE) and ``metadata``.
"""

from __future__ import annotations

from collections.abc import Mapping


class MotorError(Exception):
    """Base of every Motor error."""

    code = "INTERNAL"
    default_reason = "INTERNAL"

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.metadata: dict[str, str] = dict(metadata or {})


class CallerError(MotorError):
    code = "INVALID_ARGUMENT"
    default_reason = "INVALID_ARGUMENT"


class InvalidArgument(CallerError):
    code = "INVALID_ARGUMENT"
    default_reason = "INVALID_ARGUMENT"


class NotFound(CallerError):
    code = "NOT_FOUND"
    default_reason = "NOT_FOUND"


class AlreadyExists(CallerError):
    code = "ALREADY_EXISTS"
    default_reason = "ALREADY_EXISTS"


class FailedPrecondition(CallerError):
    code = "FAILED_PRECONDITION"
    default_reason = "FAILED_PRECONDITION"


class Aborted(CallerError):
    code = "ABORTED"
    default_reason = "ABORTED"


class Unauthenticated(CallerError):
    code = "UNAUTHENTICATED"
    default_reason = "UNAUTHENTICATED"


class PermissionDenied(CallerError):
    code = "PERMISSION_DENIED"
    default_reason = "PERMISSION_DENIED"


class ResourceExhausted(CallerError):
    code = "RESOURCE_EXHAUSTED"
    default_reason = "RESOURCE_EXHAUSTED"


class PeerError(MotorError):
    code = "UNAVAILABLE"
    default_reason = "PEER_UNAVAILABLE"


class Unavailable(PeerError):
    code = "UNAVAILABLE"
    default_reason = "UNAVAILABLE"


class DeadlineExceeded(PeerError):
    code = "DEADLINE_EXCEEDED"
    default_reason = "DEADLINE_EXCEEDED"


class Internal(MotorError):
    code = "INTERNAL"
    default_reason = "INTERNAL"


class ConfigError(MotorError):
    """Invalid configuration; the process must exit non-zero with this message."""

    code = "INVALID_ARGUMENT"
    default_reason = "INVALID_CONFIG"
