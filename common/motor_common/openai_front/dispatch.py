"""What the HTTP routes need from a coordinator: the :class:`DispatchClient` Protocol.

A dispatch yields a :class:`Head` (status, content type) and then body chunks. Every failure is a
:class:`DispatchFailed` carrying the OpenAI error to send; before the head it becomes the response,
after it a final SSE error event. ``motor-gateway`` implements it over gRPC with failover
(``motor_gateway.client.GrpcDispatchClient``); the co-located front (``motor-coordinator`` with an
``http`` section) in process, without gRPC (``motor_coordinator.http_front``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from motor_common.model_card import ModelCard
from motor_common.openai_front.openai import HttpError

__all__ = ["DispatchClient", "DispatchFailed", "DispatchStream", "Head", "ModelInfo", "Readiness"]


class DispatchFailed(Exception):
    """A dispatch failed; ``error`` is what the HTTP client gets."""

    def __init__(self, error: HttpError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass(frozen=True, slots=True)
class Head:
    status: int
    content_type: str


@dataclass(frozen=True, slots=True)
class ModelInfo:
    id: str
    created: int
    # The engines' own card of the model (root, max_model_len, parent, permission), once known.
    card: ModelCard | None = None


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str
    address: str


class DispatchStream(Protocol):
    """One dispatched request after its head: the body chunks, then :meth:`aclose`."""

    head: Head
    # The request's deadline on the event loop's clock (``loop.time()``): the coordinator ends the
    # request by then; the front also stops relaying it by then (a client that stopped reading).
    deadline: float

    def chunks(self) -> AsyncIterator[bytes]:
        """The body chunks; raises :class:`DispatchFailed` if the response breaks."""
        ...

    async def aclose(self) -> None:
        """Stop the request if it is still running (client gone); idempotent."""
        ...


class DispatchClient(Protocol):
    async def dispatch(self, request_id: str, api: str, raw: bytes, body: dict[str, Any]) -> DispatchStream:
        """Send one request (*raw* bytes and the already parsed *body*; *api* ``completions`` or
        ``chat``); returns once the head arrived. Raises :class:`DispatchFailed`."""
        ...

    async def models(self, request_id: str) -> list[ModelInfo]:
        ...

    async def readiness(self) -> Readiness:
        ...
