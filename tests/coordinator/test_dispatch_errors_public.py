"""What a gRPC ``Dispatch`` (and ``DispatchMany``, the gateway's) client sees when things fail names no engine and no exception.

Real ``motor-sim`` engines behind an in-process coordinator's gRPC API, one failure mode at a time:
an engine down (prefill, decode, union), an engine answering 500 with its internals (the
``engine_error`` fault: vLLM's shape, ``type: "EngineDeadError"``, a host:port in the message),
a KV hand-off that keeps failing, a request that does not finish in time. Each error the client
receives (gRPC status details, the ``google.rpc.Status`` trailer, a relayed body) must be free of
engine addresses and exception class names, name the request id, and the coordinator's log must
have the details under that request id.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest

from motor_common.domain import EngineType, Role
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.grpc_server import error_reason
from motor_coordinator.app import Coordinator
from tests.coordinator.grpc_util import Stubs
from tests.coordinator.test_decode_retry_sim import coordinator
from tests.coordinator.test_dispatch_sim import COMPLETIONS, MODEL, instance
from tests.coordinator.test_kv_load_retry_sim import set_fault
from tests.helpers import free_port
from tests.procs import Proc, start_simulator

pytestmark = pytest.mark.slow

VLLM = EngineType.VLLM
BODY = {"model": MODEL, "prompt": "What went wrong?", "max_tokens": 4}
# Exception class names (Python's and the engines'), tracebacks, socket words.
INTERNALS = re.compile(r"[A-Z][A-Za-z]*(Error|Exception)\b|Traceback|errno|Errno|Connect(ion|or)")


@dataclass
class Gone:
    """An engine endpoint nobody listens on (for ``instance``)."""

    port: int
    extra: dict[str, Any] = field(default_factory=dict)


class Seen:
    """Everything one failed call gave the client."""

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.code: grpc.StatusCode | None = None
        self.reason = ""
        self.texts: list[str] = []
        self.status = 0

    def assert_public(self, sims: list[Any]) -> None:
        assert self.texts, "the client got no error"
        for text in self.texts:
            assert "127.0.0.1" not in text and "localhost" not in text, text
            for port in {s.port for s in sims} | {29500}:
                assert str(port) not in text, (port, text)
            assert not INTERNALS.search(text), text
        assert any(self.rid in t for t in self.texts), (self.rid, self.texts)


VIA = pytest.mark.parametrize("via", ["Dispatch", "DispatchMany"])
_CODES = {c.value[0]: c for c in grpc.StatusCode}


async def call(s: Stubs, rid: str, body: dict[str, Any] = BODY, timeout: float = 30, *,
               via: str = "Dispatch") -> Seen:
    if via == "DispatchMany":
        return await call_many(s, rid, body, timeout)
    seen = Seen(rid)
    stream = s.dispatch.Dispatch(cpb.DispatchRequest(request_id=rid, api=COMPLETIONS, body=orjson.dumps(body)),
                                 timeout=timeout)
    try:
        async for frame in stream:
            if frame.HasField("head"):
                seen.status = frame.head.http_status
            else:
                seen.texts.append(frame.chunk.decode("utf-8", "replace"))
    except grpc.aio.AioRpcError as exc:
        seen.code, seen.reason = exc.code(), error_reason(exc) or ""
        seen.texts.append(exc.details() or "")
        for key, value in exc.trailing_metadata() or ():
            if key == "grpc-status-details-bin":  # the google.rpc.Status with its ErrorInfo
                seen.texts.append(value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value))
    return seen


async def call_many(s: Stubs, rid: str, body: dict[str, Any], timeout: float) -> Seen:
    """The same request as the one command of a ``DispatchMany`` stream (what the gateway sends)."""
    seen = Seen(rid)
    start = cpb.DispatchCommand(stream_id=1, start=cpb.DispatchStart(
        request=cpb.DispatchRequest(request_id=rid, api=COMPLETIONS, body=orjson.dumps(body)),
        timeout_ms=int(timeout * 1000)))
    stream = s.dispatch.DispatchMany(timeout=timeout + 10)
    await stream.write(cpb.DispatchManyRequest(commands=[start]))
    try:
        while (msg := await stream.read()) is not grpc.aio.EOF:
            for ev in msg.events:
                kind = ev.WhichOneof("kind")
                if kind == "frame" and ev.frame.HasField("head"):
                    seen.status = ev.frame.head.http_status
                elif kind == "frame":
                    seen.texts.append(ev.frame.chunk.decode("utf-8", "replace"))
                elif kind == "error":
                    seen.code, seen.reason = _CODES[ev.error.code], ev.error.reason
                    seen.texts += [ev.error.message, *ev.error.metadata.values()]
                if kind in ("end", "error"):
                    return seen
    finally:
        stream.cancel()
    raise AssertionError("the DispatchMany stream ended without the request's end or error")


@asynccontextmanager
async def rig(tmp: Path, *roles: str, **dispatch_cfg: Any) -> AsyncIterator[tuple[Stubs, list[Proc]]]:
    async with rig_app(tmp, *roles, **dispatch_cfg) as (_, s, sims):
        yield s, sims


@asynccontextmanager
async def rig_app(tmp: Path, *roles: str, **dispatch_cfg: Any) -> AsyncIterator[tuple[Coordinator, Stubs, list[Proc]]]:
    async with AsyncExitStack() as st:
        sims = list(await asyncio.gather(*(
            st.enter_async_context(start_simulator("vllm", r, tmp, name=f"{r}-{i}")) for i, r in enumerate(roles))))
        app, s = await st.enter_async_context(coordinator(**dispatch_cfg))
        yield app, s, sims


def logged(caplog: pytest.LogCaptureFixture, rid: str, *needles: str) -> None:
    """The coordinator log has the details (the engine's address, its words) under *rid*."""
    lines = [r.getMessage() for r in caplog.records if rid in r.getMessage()]
    assert any(all(n in line for n in needles) for line in lines), (rid, needles, lines)


@VIA
async def test_engines_down(tmp_path: Path, caplog: pytest.LogCaptureFixture, via: str) -> None:
    caplog.set_level(logging.INFO)
    dead = free_port()  # nobody listens there
    async with rig_app(tmp_path, "prefill", "decode", "union") as (app, s, (p, d, u)):
        ghost = Gone(dead)  # an endpoint whose engine is gone
        cases = {
            "prefill": (instance(1, Role.PREFILL, VLLM, [ghost]), instance(2, Role.DECODE, VLLM, [d])),
            "decode": (instance(1, Role.PREFILL, VLLM, [p]), instance(2, Role.DECODE, VLLM, [ghost])),
            "union": (instance(3, Role.UNION, VLLM, [ghost]),),
        }
        # with scheduler.decode_only_fallback / prefill_only_fallback (the defaults) the vLLM decode
        # computes a request whose prefill is unreachable, the prefill one whose decode is
        # (tests/coordinator/test_dispatch_sim.py); off, they fail PREFILL_FAILED / DECODE_FAILED
        app.scheduler.decode_only_fallback = app.scheduler.prefill_only_fallback = False
        for role, instances in cases.items():
            await s.set(*instances)
            rid = f"down-{role}"
            seen = await call(s, rid, via=via)
            assert seen.code == grpc.StatusCode.UNAVAILABLE and seen.reason == f"{role.upper()}_FAILED", seen.texts
            seen.assert_public([p, d, u, ghost])
            logged(caplog, rid, f"127.0.0.1:{dead}")


@VIA
async def test_engine_5xx_bodies_are_replaced(tmp_path: Path, caplog: pytest.LogCaptureFixture, via: str) -> None:
    caplog.set_level(logging.INFO)
    async with rig(tmp_path, "prefill", "decode", "union") as (s, (p, d, u)):
        await s.set(instance(3, Role.UNION, VLLM, [u]))
        set_fault(u, mode="engine_error")
        for stream in (False, True):
            rid = f"union-5xx-{stream}"
            seen = await call(s, rid, dict(BODY, stream=stream), via=via)
            assert seen.code is None and seen.status == 500
            err = orjson.loads("".join(seen.texts))["error"]
            assert err["type"] == "server_error" and err["code"] == "engine_error"
            seen.assert_public([p, d, u])
            logged(caplog, rid, f"127.0.0.1:{u.port}", "EngineDeadError")

        await s.set(instance(1, Role.PREFILL, VLLM, [p]), instance(2, Role.DECODE, VLLM, [d]))
        set_fault(d, mode="engine_error")  # the decode fails after a good prefill: its 500 is relayed
        seen = await call(s, "decode-5xx", via=via)
        assert seen.status == 500 and orjson.loads("".join(seen.texts))["error"]["code"] == "engine_error"
        seen.assert_public([p, d, u])
        logged(caplog, "decode-5xx", f"127.0.0.1:{d.port}", "EngineDeadError")

        set_fault(d, mode="none")
        set_fault(p, mode="engine_error")  # a prefill's 500 is retried, then the call fails
        seen = await call(s, "prefill-5xx", via=via)
        assert seen.code == grpc.StatusCode.UNAVAILABLE and seen.reason == "PREFILL_FAILED"
        seen.assert_public([p, d, u])
        logged(caplog, "prefill-5xx", f"127.0.0.1:{p.port}")


@VIA
async def test_kv_handoff_failure(tmp_path: Path, caplog: pytest.LogCaptureFixture, via: str) -> None:
    caplog.set_level(logging.INFO)
    async with rig(tmp_path, "prefill", "decode", kv_load_retries=1) as (s, (p, d)):
        await s.set(instance(1, Role.PREFILL, VLLM, [p]), instance(2, Role.DECODE, VLLM, [d]))
        set_fault(d, mode="kv_load_fail")
        for stream in (False, True):
            rid = f"kv-{stream}"
            seen = await call(s, rid, dict(BODY, stream=stream), via=via)
            assert seen.code == grpc.StatusCode.UNAVAILABLE and seen.reason == "KV_TRANSFER_FAILED", seen.texts
            seen.assert_public([p, d])
            logged(caplog, rid, f"127.0.0.1:{p.port}", f"127.0.0.1:{d.port}", "InternalServerError")


@VIA
async def test_timeout(tmp_path: Path, via: str) -> None:
    async with rig(tmp_path, "union", request_timeout_sec=1.5) as (s, (u,)):
        await s.set(instance(3, Role.UNION, VLLM, [u]))
        set_fault(u, mode="hang")  # takes the request, never answers
        seen = await call(s, "too-slow", via=via)
        assert seen.code == grpc.StatusCode.DEADLINE_EXCEEDED and seen.reason == "REQUEST_TIMEOUT", seen.texts
        seen.assert_public([u])
