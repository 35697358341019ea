"""Sending one Dispatch through the pool with failover: the call and its first frame, or an error.

Before the head frame nothing has reached the HTTP client, so a request may be sent again:

* no route (failover in progress): wait up to ``pool.failover_timeout`` for a master;
* the call failed before its head with a retryable status (``routing.retryable``: coordinator
  unreachable, NOT_MASTER, ISOLATED): probe at once and send it to the (new) master;
* REGISTRY_NOT_SYNCED (a coordinator elected before the controller synced it): wait for a ready
  route (``pool.wait_ready``), then send it again;
* the route moved to another coordinator while we waited for the head (the old master froze or
  was cut off; its call may never answer): cancel it and send the request to the new master.

At most ``pool.dispatch_attempts`` sends per request, all inside the request's own deadline. After
the head, nothing is retried (bytes may have reached the client). A client that goes away while
its request waits for the head stops the request: a Dispatch call is cancelled, a request on the
DispatchMany stream gets its ``cancel`` command (ahead of any later request on that stream).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc

from motor_common.errors import Unavailable
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.grpc_server import AUTHORIZATION_HEADER, error_reason
from motor_common.leadership import DEGRADED_HEADER
from motor_common.tracing import TRACEPARENT, TRACESTATE
from motor_gateway.pool import CoordinatorPool
from motor_gateway.routing import retryable

log = logging.getLogger(__name__)

DEGRADED_METADATA = (DEGRADED_HEADER, "1")

Call = Any  # grpc.aio.UnaryStreamCall[DispatchRequest, DispatchResponse], or a mux.MuxCall


class _Moved(Exception):
    """The route left the coordinator this call went to before the head arrived."""


async def _first_frame(pool: CoordinatorPool, call: Call, address: str) -> Any:
    """``call.read()`` unless the route moves to another coordinator first."""
    if pool.single:  # one coordinator: the route never moves (no watcher task per request)
        return await call.read()
    read = asyncio.ensure_future(call.read())
    try:
        while True:
            changed = pool.changed()
            moved = asyncio.ensure_future(changed.wait())
            try:
                await asyncio.wait({read, moved}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                moved.cancel()
            if read.done():
                return read.result()
            if pool.route.address is not None and pool.route.address != address:
                raise _Moved(pool.route.address)
    finally:
        if not read.done():
            read.cancel()


async def dispatch(
    pool: CoordinatorPool,
    request: cpb.DispatchRequest,
    *,
    timeout: float,
    metadata: tuple[tuple[str, str], ...],
) -> tuple[Call, Any]:
    """Returns ``(call, first_frame)``; raises ``grpc.aio.AioRpcError`` (the last failure) or
    ``Unavailable`` ``NO_MASTER_COORDINATOR`` when no coordinator could take the request."""
    deadline = time.monotonic() + timeout
    failover_deadline = min(deadline, time.monotonic() + pool.failover_timeout)
    last_exc: grpc.aio.AioRpcError | None = None
    for attempt in range(1, pool.dispatch_attempts + 1):
        route = await pool.wait_route(failover_deadline)
        if route.address is None:
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            return await _send(pool, route.address, request, remaining, metadata, route.degraded)
        except _Moved as moved:
            log.warning("coordinator route moved before the head: resending",
                        extra={"old": route.address, "new": str(moved), "attempt": attempt})
        except grpc.aio.AioRpcError as exc:
            reason = error_reason(exc)
            if pool.single or not retryable(exc.code().name, reason):
                raise
            last_exc = exc
            log.warning("dispatch failed before the head: trying the master again",
                        extra={"coordinator": route.address, "code": exc.code().name,
                               "reason": reason, "attempt": attempt})
            if reason == "REGISTRY_NOT_SYNCED":
                # Elected before the controller synced it: wait for a ready route (a synced peer,
                # or this one once its instance set arrives), within the failover bound.
                await pool.wait_ready(failover_deadline)
            elif pool.route.address == route.address:
                # Re-decide first: a fresh probe, or the route change it causes.
                await _probed(pool, failover_deadline)
    if last_exc is not None:
        raise last_exc
    raise Unavailable(pool.route.reason or "no master coordinator", reason="NO_MASTER_COORDINATOR")


async def _send(pool: CoordinatorPool, address: str, request: cpb.DispatchRequest, timeout: float,
                metadata: tuple[tuple[str, str], ...], degraded: bool) -> tuple[Call, Any]:
    """One send to *address* and its first frame: on the coordinator's DispatchMany stream, or a
    Dispatch call if it has none (an older coordinator answers UNIMPLEMENTED: sent again as a
    Dispatch call at once, and every later request too)."""
    mux = pool.mux(address)
    for multiplexed in (True, False):
        if multiplexed and not mux.supported:
            continue
        if multiplexed:
            # The stream carries the credential once; the request id travels in the request, the
            # trace context and the degraded hint in its start command.
            call = mux.dispatch(request, timeout=timeout, degraded=degraded,
                                trace={k: v for k, v in metadata if k in (TRACEPARENT, TRACESTATE)},
                                metadata=tuple(kv for kv in metadata if kv[0] == AUTHORIZATION_HEADER))
        else:
            md = (*metadata, DEGRADED_METADATA) if degraded else metadata
            call = pool.stub(address).Dispatch(request, timeout=timeout, metadata=md)
        try:
            return call, await _first_frame(pool, call, address)
        except grpc.aio.AioRpcError as exc:
            if not (multiplexed and exc.code() == grpc.StatusCode.UNIMPLEMENTED and not mux.supported):
                raise
        except BaseException:
            # The route moved (``_Moved``), the HTTP client went away before the head (the handler
            # is cancelled), or anything else: stop the request. A Dispatch call is cancelled with its read anyway; a request
            # on the DispatchMany stream needs its cancel command, or the coordinator and engine
            # run it to its deadline while the gateway counts it gone.
            call.cancel()
            raise
    raise AssertionError("unreachable")  # pragma: no cover


async def _probed(pool: CoordinatorPool, deadline: float) -> None:
    """Wait for the next route change or one probe interval, whichever is first."""
    changed = pool.changed()
    pool.kick()
    try:
        async with asyncio.timeout(max(0.0, min(0.5, deadline - time.monotonic()))):
            await changed.wait()
    except TimeoutError:
        pass
