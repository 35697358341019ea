"""SGLang-style bootstrap server: decode engines meet prefill engines on a ``bootstrap_room``.

Wire (see ``framing``): one length-prefixed JSON frame each way per TCP connection.

    request  {"op": "fetch_room", "room": int, "timeout_s": float}
    reply    {"ok": true, "kv": {...KVPayload...}} | {"ok": false, "error": str}

The prefill engine answers once its request for that room has been prefilled (or after
``timeout_s``); the prefill request completes only after the decode took the room.
"""

from __future__ import annotations

from typing import Any

from motor_sim import framing
from motor_sim.kvtransfer import KVPayload, TransferError
from motor_sim.service import SimService


def make_handler(svc: SimService) -> framing.Handler:
    async def handle(msg: dict[str, Any]) -> dict[str, Any]:
        if msg.get("op") != "fetch_room":
            return {"ok": False, "error": f"unknown op {msg.get('op')!r}"}
        room = msg.get("room")
        if isinstance(room, bool) or not isinstance(room, int):
            return {"ok": False, "error": "room must be an integer"}
        timeout_s = float(msg.get("timeout_s", svc.cfg.waiting_timeout_s))
        try:
            payload = await svc.rooms.take(room, timeout_s)
        except TransferError as exc:
            return {"ok": False, "error": str(exc)}
        svc.stats.kv_transfers += 1
        return {"ok": True, "kv": payload.to_wire()}

    return handle


async def fetch_room(host: str, port: int, room: int, timeout_s: float) -> KVPayload:
    """Decode side: wait for the prefill of ``room``; raises ``TransferError``."""
    msg = {"op": "fetch_room", "room": room, "timeout_s": timeout_s}
    try:
        reply = await framing.request(host, port, msg, timeout_s + 2.0)
    except framing.PeerError as exc:
        raise TransferError(
            f"Failed to get kvcache from prefill instance, it might be dead ({exc})"
        ) from exc
    if not reply.get("ok"):
        raise TransferError(str(reply.get("error", "prefill refused the transfer")))
    kv = reply.get("kv")
    if not isinstance(kv, dict):
        raise TransferError("bootstrap reply without kv")
    return KVPayload.from_wire(kv)
