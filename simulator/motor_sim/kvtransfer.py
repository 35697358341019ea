"""KV hand-off bookkeeping, free of sockets.

* ``LeaseTable`` (vLLM/NIXL style): a prefill engine pins a finished request's blocks under its
  request id until a decode engine fetches them or the lease expires.
* ``RoomTable`` (SGLang style): prefill and decode meet on a ``bootstrap_room`` number; either side
  may arrive first.

Errors::

    TransferError(reason)   -> the peer's request cannot be served (unknown, expired, forged)
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class TransferError(Exception):
    """A KV transfer that cannot be honoured; ``str(exc)`` is the reason."""


@dataclass(frozen=True, slots=True)
class KVPayload:
    """What a simulated KV transfer moves: enough state to continue generation."""

    prompt_token_ids: tuple[int, ...]
    first_token_id: int
    engine_id: str
    num_blocks: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "prompt_token_ids": list(self.prompt_token_ids),
            "first_token_id": self.first_token_id,
            "engine_id": self.engine_id,
            "num_blocks": self.num_blocks,
        }

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> KVPayload:
        try:
            ids = msg["prompt_token_ids"]
            if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
                raise TypeError("prompt_token_ids")
            return cls(
                tuple(ids), int(msg["first_token_id"]), str(msg["engine_id"]), int(msg["num_blocks"])
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise TransferError(f"malformed KV payload: {exc}") from exc


@dataclass(slots=True)
class Lease:
    request_id: str
    block_ids: tuple[int, ...]
    payload: KVPayload
    expires_at: float


@dataclass
class LeaseTable:
    engine_id: str
    _leases: dict[str, Lease] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._leases)

    def put(self, lease: Lease) -> None:
        self._leases[lease.request_id] = lease

    def take(
        self, request_id: str, engine_id: str, block_ids: Sequence[int] | None, now: float
    ) -> Lease:
        """Hand a lease over (removing it) or raise ``TransferError``."""
        if engine_id != self.engine_id:
            raise TransferError(f"engine id mismatch: asked {engine_id!r}, this is {self.engine_id!r}")
        lease = self._leases.get(request_id)
        if lease is None:
            raise TransferError(f"no KV blocks pinned for request {request_id!r}")
        if lease.expires_at <= now:
            del self._leases[request_id]
            raise TransferError(f"KV lease for request {request_id!r} expired")
        if block_ids is not None and tuple(block_ids) != lease.block_ids:
            raise TransferError(f"block ids do not match the lease of request {request_id!r}")
        del self._leases[request_id]
        return lease

    def expire(self, now: float) -> list[Lease]:
        gone = [lease for lease in self._leases.values() if lease.expires_at <= now]
        for lease in gone:
            del self._leases[lease.request_id]
        return gone

    def drain(self) -> list[Lease]:
        gone = list(self._leases.values())
        self._leases.clear()
        return gone


@dataclass
class _Room:
    payload: asyncio.Future[KVPayload]
    taken: asyncio.Future[None]


class RoomTable:
    def __init__(self) -> None:
        self._rooms: dict[int, _Room] = {}

    def __len__(self) -> int:
        return len(self._rooms)

    def _entry(self, room: int) -> _Room:
        entry = self._rooms.get(room)
        if entry is None:
            loop = asyncio.get_running_loop()
            entry = _Room(loop.create_future(), loop.create_future())
            self._rooms[room] = entry
        return entry

    async def publish(self, room: int, payload: KVPayload, timeout_s: float) -> None:
        """Prefill side: offer the KV and wait until a decode engine took it."""
        entry = self._entry(room)
        if entry.payload.done():
            raise TransferError(f"bootstrap room {room} is already in use")
        entry.payload.set_result(payload)
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(entry.taken)
        except TimeoutError as exc:
            raise TransferError(
                f"Decode instance could be dead, no decode took room {room} in {timeout_s:g}s"
            ) from exc
        finally:
            if self._rooms.get(room) is entry:
                del self._rooms[room]

    async def take(self, room: int, timeout_s: float) -> KVPayload:
        """Decode side: wait for the room's KV, then mark it taken."""
        entry = self._entry(room)
        try:
            async with asyncio.timeout(timeout_s):
                payload = await asyncio.shield(entry.payload)
        except TimeoutError as exc:
            if self._rooms.get(room) is entry:
                del self._rooms[room]
            raise TransferError(
                f"Request {room} timed out after {timeout_s:g} seconds in KVPoll.WaitingForInput"
            ) from exc
        if not entry.taken.done():
            entry.taken.set_result(None)
        if self._rooms.get(room) is entry:
            del self._rooms[room]
        return payload
