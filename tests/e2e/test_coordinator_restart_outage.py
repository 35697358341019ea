"""``kill -9`` of the only coordinator (no HA), end to end (issue 12): 8 ``openai`` SDK clients in a
closed loop through a real ``motor-gateway``; the coordinator is SIGKILLed, restarted on its port,
and gets its instance set again (as the controller's push or ``motor register`` would give it).

While it is unreachable, and while it is up but has no instance set yet, every request is answered
503 with ``Retry-After`` — never 404 (``model_not_found`` is final for SDKs, which do not retry it).
The outage (first to last failed request) is printed; docs/fault-tolerance.md quotes it.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest

from motor_common.domain import EngineType, Role
from tests.coordinator.grpc_util import KEY, Stubs
from tests.coordinator.test_dispatch_sim import MODEL, instance
from tests.helpers import free_port, wait_for
from tests.procs import start_coordinator, start_gateway, start_simulator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

CLIENTS = 8


@dataclass
class Load:
    ok: int = 0
    failures: list[tuple[float, int, str | None, str | None]] = field(default_factory=list)  # t, status, code, Retry-After
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def client(self, base_url: str) -> None:
        c = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=10)
        while not self.stop.is_set():
            try:
                await c.completions.create(model=MODEL, prompt="ping", max_tokens=2)
                self.ok += 1
            except openai.APIStatusError as exc:
                body = exc.body if isinstance(exc.body, dict) else {}
                self.failures.append((time.monotonic(), exc.status_code, body.get("code"),
                                      exc.response.headers.get("retry-after")))
                await asyncio.sleep(0.05)  # a client backing off (not synchronisation)
            except openai.APIConnectionError:
                self.failures.append((time.monotonic(), 0, "connection", None))


async def test_kill_9_of_the_only_coordinator_gives_503_with_retry_after_never_404(tmp_path: Path) -> None:
    async with AsyncExitStack() as st:
        p, d = await asyncio.gather(*(st.enter_async_context(start_simulator("vllm", r, tmp_path, name=r))
                                      for r in ("prefill", "decode")))
        insts = (instance(1, Role.PREFILL, EngineType.VLLM, [p]), instance(2, Role.DECODE, EngineType.VLLM, [d]))
        port = free_port()
        args = ("--port", str(port))
        c1 = await st.enter_async_context(start_coordinator(tmp_path, management_key=KEY, extra_args=args))
        s1 = Stubs(c1.address)
        st.push_async_callback(s1.close)
        await s1.set(*insts)
        gw = await st.enter_async_context(start_gateway(tmp_path, [c1.address]))
        load = Load()
        clients = [asyncio.ensure_future(load.client(gw.url + "/v1")) for _ in range(CLIENTS)]
        try:
            await wait_for(lambda: load.ok >= 50, timeout=20, what="traffic flowing")
            c1.kill()
            t_kill = time.monotonic()
            await wait_for(lambda: len(load.failures) >= 5, timeout=10, what="failures while it is down")
            c2 = await st.enter_async_context(
                start_coordinator(tmp_path, management_key=KEY, extra_args=args, name="coordinator-2"))
            t_up = time.monotonic()
            s2 = Stubs(c2.address)
            st.push_async_callback(s2.close)
            # up, but without its instance set: still refusing, now as not synced (was 404 once)
            n = len(load.failures)
            await wait_for(lambda: any(code == "service_unavailable" for _, _, code, _ in load.failures[n:]),
                           timeout=15, what="the restarted coordinator refusing as not synced")
            await s2.set(*insts)
            t_set = time.monotonic()
            ok = load.ok
            await wait_for(lambda: load.ok >= ok + 50, timeout=20, what="traffic flowing again")
        finally:
            load.stop.set()
            await asyncio.gather(*clients, return_exceptions=True)
        statuses = {(status, code) for _, status, code, _ in load.failures}
        # unreachable: coordinator_unreachable; up but not synced: service_unavailable
        assert statuses <= {(503, "coordinator_unreachable"), (503, "service_unavailable")}, statuses
        assert all(ra is not None and int(ra) >= 1 for _, _, _, ra in load.failures), load.failures[:5]
        last = max(t for t, *_ in load.failures)
        print(f"\nnon-HA coordinator kill -9: {len(load.failures)} requests answered 503 + Retry-After "
              f"(codes {sorted(str(c) for _, c in statuses)}); restarted process serving gRPC "
              f"{t_up - t_kill:.2f}s after the kill; instance set {t_set - t_kill:.2f}s after; "
              f"last failure {last - t_kill:.2f}s after the kill")
