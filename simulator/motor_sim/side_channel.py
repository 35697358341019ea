"""vLLM NIXL-style side channel: a decode engine pulls pinned KV blocks from a prefill engine.

Wire (see ``framing``): one length-prefixed JSON frame each way per TCP connection.

    request  {"op": "nixl_fetch", "remote_engine_id": str, "remote_request_id": str,
              "remote_block_ids": [int, ...]}     (the decode flattens vLLM's per-group lists)
    reply    {"ok": true, "kv": {"prompt_token_ids": [...], "first_token_id": int,
              "engine_id": str, "num_blocks": int}}
           | {"ok": false, "error": str}

A successful fetch frees the blocks on the producer (the lease is consumed).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from motor_sim import framing
from motor_sim.kvtransfer import KVPayload, TransferError
from motor_sim.service import SimService

REQUIRED = ("remote_engine_id", "remote_request_id", "remote_block_ids", "remote_host", "remote_port")


def make_handler(svc: SimService) -> framing.Handler:
    async def handle(msg: dict[str, Any]) -> dict[str, Any]:
        if msg.get("op") != "nixl_fetch":
            return {"ok": False, "error": f"unknown op {msg.get('op')!r}"}
        block_ids = msg.get("remote_block_ids")
        try:
            lease = svc.leases.take(
                str(msg.get("remote_request_id")),
                str(msg.get("remote_engine_id")),
                block_ids if isinstance(block_ids, list) else None,
                time.monotonic(),
            )
        except TransferError as exc:
            return {"ok": False, "error": str(exc)}
        svc.release_lease(lease)
        svc.stats.kv_transfers += 1
        return {"ok": True, "kv": lease.payload.to_wire()}

    return handle


def flat_block_ids(groups: Any) -> list[int]:
    """vLLM 0.32 names the blocks per KV cache group (``[[1, 2]]``); one group here."""
    if (not isinstance(groups, list) or len(groups) != 1 or not isinstance(groups[0], list)
            or not all(isinstance(b, int) and not isinstance(b, bool) for b in groups[0])):
        raise TransferError(f"remote_block_ids must hold one list of block ids per KV cache group, "
                            f"got {groups!r}")
    return list(groups[0])


async def fetch(params: Mapping[str, Any], timeout_s: float) -> KVPayload:
    """Decode side: pull the KV named by ``kv_transfer_params``; raises ``TransferError``."""
    missing = [k for k in REQUIRED if params.get(k) in (None, "")]
    if missing:
        raise TransferError(f"kv_transfer_params missing {', '.join(missing)}")
    try:
        port = int(params["remote_port"])
    except (TypeError, ValueError) as exc:
        raise TransferError(f"bad remote_port {params['remote_port']!r}") from exc
    msg = {
        "op": "nixl_fetch",
        "remote_engine_id": params["remote_engine_id"],
        "remote_request_id": params["remote_request_id"],
        "remote_block_ids": flat_block_ids(params["remote_block_ids"]),
    }
    try:
        reply = await framing.request(str(params["remote_host"]), port, msg, timeout_s)
    except framing.PeerError as exc:
        raise TransferError(f"side channel: {exc}") from exc
    if not reply.get("ok"):
        raise TransferError(str(reply.get("error", "remote refused the transfer")))
    kv = reply.get("kv")
    if not isinstance(kv, dict):
        raise TransferError("side channel reply without kv")
    return KVPayload.from_wire(kv)
