"""A real vLLM engine (CPU lane) takes Motor's traceparent: started with --otlp-traces-endpoint, its
``llm_request`` span is a child of the coordinator's engine call.

Gateway and coordinator in process (spans in the SDK's in-memory exporter), joined by real gRPC;
vLLM 0.32 as a union engine exporting to an OTLP/gRPC collector run here.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import openai
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from motor_common.domain import Endpoint, EngineType, Instance, InstanceStatus, Role
from motor_common.grpc_server import ServerConfig
from motor_common.openai_front.app import Gateway, start_site
from motor_common.tracing import TracingConfig, reset_tracing, setup_tracing
from motor_coordinator.app import Coordinator
from motor_coordinator.config import CoordinatorConfig, DispatchConfig
from motor_gateway.client import GrpcDispatchClient
from motor_gateway.pool import CoordinatorPool
from tests.coordinator.grpc_util import KEY, Stubs
from tests.helpers import wait_for
from tests.observe.test_tracing import client_traceparent, collector
from tests.realengine.test_vllm_vs_simulator import (
    LIMITS,
    MODEL_DIR,
    NAME,
    REAL_VLLM,
    Engine,
    _spawn,
    _status,
    _stop,
    lane,
)

pytestmark = lane(900)


async def test_real_vllm_parents_its_request_span_on_the_traceparent_motor_sends() -> None:
    exporter = InMemorySpanExporter()
    async with collector() as (col, col_port):
        with tempfile.TemporaryDirectory(prefix="realengine-trace-") as tmp:
            real = _spawn("vllm", [str(REAL_VLLM), "serve", str(MODEL_DIR), "--served-model-name", NAME, *LIMITS,
                                   "--otlp-traces-endpoint", f"http://127.0.0.1:{col_port}"], Path(tmp), dict(os.environ))
            setup_tracing(TracingConfig(enabled=True), "test", exporter=exporter)
            app = None
            try:
                await wait_for(lambda: asyncio.to_thread(_healthy, real), timeout=600, what="vLLM healthy")
                app = Coordinator(CoordinatorConfig(server=ServerConfig(port=0), dispatch=DispatchConfig(
                    health_probe_interval_sec=0, metrics_scrape_interval_sec=0)), management_key=KEY)
                port = await app.start()
                stubs = Stubs(f"127.0.0.1:{port}")
                union = Instance(1, Role.UNION, "job-1", NAME, EngineType.VLLM,
                                 (Endpoint(0, "127.0.0.1", real.port),), InstanceStatus.AVAILABLE)
                await stubs.set(union)
                await stubs.close()
                pool = CoordinatorPool([f"127.0.0.1:{port}"])
                runner, http_port = await start_site(
                    Gateway(GrpcDispatchClient(pool, request_timeout=120, control_timeout=3)).make_app(),
                    "127.0.0.1", 0, shutdown_timeout=1)
                pool.start()
                try:
                    traceparent, tid, _ = client_traceparent()
                    async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused",
                                                  max_retries=0, timeout=120) as client:
                        resp = await client.completions.create(model=NAME, prompt="Hello, Motor", max_tokens=4,
                                                               extra_headers={"traceparent": traceparent})
                    assert resp.choices[0].text
                    engine_spans = await wait_for(
                        lambda: [s for _, s in col.spans if s.trace_id.hex() == tid] or None,
                        timeout=60, what="vLLM's span of the request at the collector")
                finally:
                    await runner.cleanup()
                    await pool.close()
            finally:
                if app is not None:
                    await app.stop(0)
                _stop(real)
                reset_tracing()
    ours = {s.name: s for s in exporter.get_finished_spans()}
    call = ours["union"]
    assert call.context.trace_id == int(tid, 16)
    assert [s.name for s in engine_spans] == ["llm_request"], engine_spans
    assert engine_spans[0].parent_span_id == call.context.span_id.to_bytes(8, "big")



def _healthy(real: Engine) -> bool:
    """vLLM answers /health; its log if it exited."""
    if real.proc.poll() is not None:
        raise AssertionError(f"vLLM exited with {real.proc.returncode}:\n{real.log()}")
    return _status(real.url + "/health") == 200
