"""DP scale-down proxy: runs :mod:`motor_nodemanager.scale_down` against this node and its engines.

The engines' fault-tolerance surface is vLLM's (``--enable-fault-tolerance``, external-LB DP):

- ``POST /fault_tolerance/apply {"instruction": "scale_down", "params": {"dead_ranks": [..]}}`` →
  ``202 Accepted`` (the engine reconfigures asynchronously; a 200 is accepted too);
- ``GET /fault_tolerance/status`` → a JSON object whose ``status`` is ``healthy`` / ``unhealthy``
  (``dead`` counts as unhealthy).

Only the surviving engines of this node (not dead, not retired) are called. The apply reaches them at
most once per request id (the state machine is APPLYING before the first call). Errors of the
engines' HTTP surface are translated here (an engine refusing the apply → INTERNAL
``SCALE_DOWN_APPLY_FAILED``; the transaction stays APPLYING and the controller aborts it).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from motor_common.domain import Endpoint
from motor_common.errors import Aborted, FailedPrecondition, Internal
from motor_nodemanager import scale_down as sd

if TYPE_CHECKING:
    from motor_nodemanager.node import Node

log = logging.getLogger(__name__)

ENGINE_TIMEOUT_SEC = 2.0
# What is read of an engine's answer: the start of a refused apply's body (for the error), a status
# object up to MAX_STATUS_BYTES (a larger one counts as no answer). Within ENGINE_TIMEOUT_SEC an
# engine on loopback can send gigabytes; none of it is buffered past these bounds.
MAX_ERROR_BYTES = 300
MAX_STATUS_BYTES = 64 * 1024


async def _read_at_most(resp: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The body, or None once it passes *limit* bytes (not read further)."""
    data = b""
    while chunk := await resp.content.read(limit + 1 - len(data)):
        data += chunk
        if len(data) > limit:
            return None
    return data


async def _post_apply(session: aiohttp.ClientSession, ep: Endpoint, dead: list[int]) -> str:
    """'' when accepted, else the error."""
    body = {"instruction": "scale_down", "params": {"dead_ranks": dead}}
    try:
        async with session.post(f"{ep.base_url}/fault_tolerance/apply", data=orjson.dumps(body),
                                headers={"content-type": "application/json"}, allow_redirects=False) as resp:  # fmt: skip
            if resp.status in (200, 202):
                return ""
            text = (await resp.content.read(MAX_ERROR_BYTES)).decode(errors="replace")
            return f"endpoint {ep.id}: /fault_tolerance/apply answered {resp.status}: {text}"
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        return f"endpoint {ep.id}: /fault_tolerance/apply failed: {type(exc).__name__}: {exc}"


async def _get_status(session: aiohttp.ClientSession, ep: Endpoint) -> str | None:
    try:
        async with session.get(f"{ep.base_url}/fault_tolerance/status", allow_redirects=False) as resp:
            data = await _read_at_most(resp, MAX_STATUS_BYTES) if resp.status == 200 else None
            if data is None:
                return None
            body: Any = orjson.loads(data)
    except (aiohttp.ClientError, OSError, TimeoutError, orjson.JSONDecodeError):
        return None
    status = body.get("status") if isinstance(body, dict) else None
    return status if isinstance(status, str) else None


class ScaleDownProxy:
    def __init__(self, node: Node) -> None:
        self._node = node
        self.txn = sd.Txn()

    @property
    def enabled(self) -> bool:
        return self._node.cfg.fault_tolerance_config.enable_dp_scale_down

    def _require_enabled(self) -> None:
        if not self.enabled:
            raise FailedPrecondition("DP scale-down is disabled on this node", reason="SCALE_DOWN_DISABLED")

    def _local(self, ranks: frozenset[int]) -> list[Endpoint]:
        cmd = self._node.command
        return [] if cmd is None else [e for e in cmd.endpoints if e.dp_rank in ranks]

    def survivors(self) -> list[Endpoint]:
        cmd = self._node.command
        if cmd is None:
            return []
        gone = self.txn.dead_ranks | self.txn.retired
        return [e for e in cmd.endpoints if e.dp_rank not in gone]

    def _step(self, event: sd.Event, request_id: str, **kw: Any) -> sd.Step:
        st = sd.step(self.txn, event, request_id=request_id, now=self._node.clock(), **kw)
        if st.verdict is sd.Verdict.STALE:
            raise Aborted(f"scale-down request {request_id!r} is stale (current {self.txn.request_id!r}, "
                          f"phase {self.txn.phase.value})", reason="SCALE_DOWN_STALE_REQUEST")  # fmt: skip
        if st.verdict is sd.Verdict.BUSY:
            raise Aborted(f"scale-down {self.txn.request_id!r} is in progress", reason="SCALE_DOWN_BUSY")
        if st.verdict is sd.Verdict.NOT_APPLIED:
            raise FailedPrecondition("scale-down not applied yet: commit needs an apply first",
                                     reason="SCALE_DOWN_NOT_APPLIED")  # fmt: skip
        if st.txn.phase is not self.txn.phase:
            log.warning("scale-down %s: %s -> %s (%s)", request_id, self.txn.phase.value, st.txn.phase.value,
                        event.value, extra={"dead_ranks": sorted(st.ranks)})  # fmt: skip
        self.txn = st.txn
        return st

    # --- the calls ---------------------------------------------------------------------------------
    def guard(self, request_id: str, instance_id: int, lease_sec: float, dead_ranks: list[int]) -> None:
        self._require_enabled()
        cmd = self._node.command
        if cmd is None or (instance_id and instance_id != cmd.instance_id):
            raise FailedPrecondition(f"instance {instance_id} is not running here", reason="INSTANCE_MISMATCH")
        if not request_id or lease_sec <= 0 or not dead_ranks:
            raise FailedPrecondition("guard needs a request id, a lease > 0 and dead ranks", reason="INVALID_GUARD")
        st = self._step(sd.Event.GUARD, request_id, lease_sec=lease_sec, dead_ranks=dead_ranks, instance_id=instance_id)
        if st.effect is sd.Effect.FREEZE:
            self._node.arbiter.freeze(st.txn.lease_deadline)

    async def apply(self, request_id: str) -> None:
        self._require_enabled()
        st = self._step(sd.Event.APPLY, request_id)
        if st.effect is not sd.Effect.PROXY_APPLY:
            return  # repeated: the engines were already told (exactly once)
        dead = sorted(st.ranks)
        timeout = aiohttp.ClientTimeout(total=ENGINE_TIMEOUT_SEC)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            errors = [e for e in await asyncio.gather(*(_post_apply(session, ep, dead) for ep in self.survivors())) if e]
        if errors:
            raise Internal("scale-down apply refused: " + "; ".join(errors), reason="SCALE_DOWN_APPLY_FAILED")

    def finalize(self, request_id: str, commit: bool) -> list[int]:
        self._require_enabled()
        st = self._step(sd.Event.COMMIT if commit else sd.Event.ABORT, request_id)
        self._effect(st, request_id)
        return sorted(self.txn.retired)

    def expire(self) -> None:
        """Scheduled re-check (daemon tick): a guard whose lease passed without finalize reverts."""
        if self.txn.phase is sd.Phase.IDLE:
            return
        rid = self.txn.request_id
        st = self._step(sd.Event.EXPIRE, rid)
        if st.verdict is sd.Verdict.OK:
            log.error("scale-down %s: lease expired without finalize: reverted", rid)
            self._effect(st, rid)

    def _effect(self, st: sd.Step, request_id: str) -> None:
        if st.effect is sd.Effect.RETIRE:
            ids = [e.id for e in self._local(st.ranks)]
            self._node.retire(ids, f"retired by DP scale-down {request_id}")
        elif st.effect is sd.Effect.REVERT:
            self._node.arbiter.unfreeze()

    async def status(self) -> tuple[sd.Reported, str, list[int]]:
        self.expire()
        health: sd.EngineHealth | None = None
        if self.enabled and self.txn.phase is not sd.Phase.IDLE:
            eps = self.survivors()
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=ENGINE_TIMEOUT_SEC)) as session:
                got = await asyncio.gather(*(_get_status(session, ep) for ep in eps))
            health = sd.engine_health({ep.dp_rank: s for ep, s in zip(eps, got, strict=True)})
        return sd.reported_state(self.enabled, self.txn, health), self.txn.request_id, sorted(self.txn.retired)
