"""The aiohttp application: OpenAI routes, health, metrics, admin (``/sim/*``) and the PD side
servers, with clean start-up and shutdown. Owns every background task it starts."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import signal
import socket
import time
import uuid
from typing import Any

import orjson
from aiohttp import web

from motor_common.kv_events import Flavour as EventFlavour
from motor_sim import bootstrap, framing, params, responses, side_channel, vllm_extra
from motor_sim.config import Flavour as FlavourName
from motor_sim.config import Role, SimConfig
from motor_sim.dp_group import DpGroup
from motor_sim.faults import Fault, FaultMode, InvalidFault, parse_fault
from motor_sim.flavour import Flavour
from motor_sim.kv_events_pub import KvEventPublisher
from motor_sim.kvtransfer import TransferError
from motor_sim.metrics import make_registry, render
from motor_sim.service import ApiError, Run, SimService
from motor_sim.sglang_api import SGLangFlavour
from motor_sim.vllm_api import VLLMFlavour
from motor_sim.zmq_fault import FaultPublisher

log = logging.getLogger("motor_sim")
_JSON = "application/json"
# The engine_error fault's answer: vLLM's error shape for an engine-side exception, whose type is
# the exception's class and whose message names engine internals (and here the host and port).
_ENGINE_ERROR = {"error": {"message": "EngineCore encountered an issue (worker 127.0.0.1:29500 died). "
                                      "See stack trace (above) for the root cause.",
                           "type": "EngineDeadError", "param": None, "code": 500}}
_DONE = b"data: [DONE]\n\n"


# Above these sizes the CPU-heavy parts of one request (JSON decoding and tokenizing the body,
# building a large non-streamed answer) run in a worker thread instead of on the event loop.
_OFFLOOP_BYTES = 256 * 1024
_OFFLOOP_TOKENS = 20_000
# /sim/state keeps the trace headers of this many recent requests, each value cut to this length.
_TRACE_HEADERS_KEPT = 64
_TRACE_HEADER_CHARS = 600


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _parse_job(raw: bytes, kind: params.Kind, max_model_len: int) -> params.Job:
    """Decode and validate one request body (pure; safe in a worker thread)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"Invalid JSON body: {exc}") from exc
    try:
        return params.parse(body, kind, max_model_len)
    except params.InvalidRequest as exc:
        raise ApiError(exc.status, exc.message, param=exc.param, value=exc.value,
                       validation=exc.validation) from exc


def _full_body(fl: Flavour, svc: SimService, run: Run, ids: responses.Ids) -> bytes:
    """The encoded non-streamed answer of a finished run (no shared state is written)."""
    return orjson.dumps(fl.shape(svc, run, responses.full_response(run, ids, fl), "full"))


class SimServer:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.svc = SimService(cfg)
        self.flavour: Flavour = VLLMFlavour() if cfg.flavour is FlavourName.VLLM else SGLangFlavour()
        self.registry = make_registry(self.svc)
        self._not_hanging = asyncio.Event()
        self._not_hanging.set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.response_store = vllm_extra.ResponseStore(cfg.responses_store)
        self._background: dict[str, asyncio.Task[Any]] = {}  # response id → its generation
        self._frame_servers: list[framing.FrameServer] = []
        self._runner: web.AppRunner | None = None
        self._zmq: FaultPublisher | None = None
        self.kv_events: KvEventPublisher | None = None
        self.active_dp_ranks: list[int] = list(range(cfg.dp_size))
        self._dp_group: DpGroup | None = None
        self._reconfig_until = 0.0
        self.port = cfg.port
        # The W3C trace headers of the last generation requests (what vLLM hands its tracer when
        # started with --otlp-traces-endpoint), for /sim/state: {"traceparent", "tracestate", "request_id"}.
        self.trace_headers: collections.deque[dict[str, str]] = collections.deque(maxlen=_TRACE_HEADERS_KEPT)

    # ---- app -------------------------------------------------------------------------------
    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._fault_middleware], client_max_size=64 * 2**20)
        if self.cfg.flavour is FlavourName.VLLM and self.cfg.request_id_headers:
            app.on_response_prepare.append(self._request_id_header)
        r = app.router
        if self.cfg.pooling:  # an embedding model (vLLM --runner pooling): no generation routes
            r.add_post("/v1/embeddings", self.embeddings)
        else:
            r.add_post("/v1/completions", self.completions)
            r.add_post("/v1/chat/completions", self.chat)
            if self.cfg.flavour is FlavourName.VLLM:
                r.add_post("/v1/responses", self.responses)
                r.add_get("/v1/responses/{response_id}", self.retrieve_response)
                r.add_post("/v1/responses/{response_id}/cancel", self.cancel_response)
        if self.cfg.flavour is FlavourName.VLLM:
            r.add_post("/tokenize", self.tokenize)
            r.add_post("/detokenize", self.detokenize)
        r.add_get("/v1/models", self.models)
        r.add_get("/health", self.health)
        r.add_get("/metrics", self.metrics)
        r.add_post("/sim/fault", self.sim_fault)
        r.add_get("/sim/state", self.sim_state)
        if self.cfg.flavour is FlavourName.VLLM:
            r.add_get("/version", self.version)
            r.add_get("/ping", self.health)
            r.add_get("/fault_tolerance/status", self.ft_status)
            r.add_post("/fault_tolerance/apply", self.ft_apply)
        else:
            r.add_get("/health_generate", self.health)
            r.add_get("/get_model_info", self.model_info)
            r.add_get("/get_server_info", self.server_info)
        return app

    @web.middleware
    async def _fault_middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if not self._not_hanging.is_set() and not request.path.startswith("/sim/"):
            await self._not_hanging.wait()
        try:
            resp: web.StreamResponse = await handler(request)
        except web.HTTPException as exc:
            if self.cfg.flavour is not FlavourName.VLLM or exc.status not in (404, 405):
                raise
            # FastAPI's default bodies, as vLLM answers unknown routes and wrong methods
            return web.Response(body=orjson.dumps({"detail": exc.reason}), status=exc.status,
                                content_type=_JSON, headers=exc.headers if exc.status == 405 else None)
        return resp

    async def _request_id_header(self, request: web.Request, resp: web.StreamResponse) -> None:
        """vLLM --enable-request-id-headers: every response echoes X-Request-Id (or a new one)."""
        if "X-Request-Id" not in resp.headers:
            resp.headers["X-Request-Id"] = request.headers.get("X-Request-Id") or uuid.uuid4().hex

    def _error(self, err: ApiError, headers: dict[str, str] | None = None) -> web.Response:
        return web.Response(body=orjson.dumps(self.flavour.error_body(err)), status=err.status,
                            content_type=_JSON, headers=headers)

    # ---- OpenAI ----------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _generate(self, request: web.Request, kind: params.Kind) -> web.StreamResponse:
        fl, svc = self.flavour, self.svc
        header_rid = request.headers.get("X-Request-Id")
        if "traceparent" in request.headers:
            self.trace_headers.append({"traceparent": request.headers["traceparent"][:_TRACE_HEADER_CHARS],
                                       "tracestate": request.headers.get("tracestate", "")[:_TRACE_HEADER_CHARS],
                                       "request_id": (header_rid or "")[:_TRACE_HEADER_CHARS]})
        headers: dict[str, str] = {}
        try:
            raw = await request.read()
            fault = svc.fault
            if fault.mode is FaultMode.POISON and fault.match.encode() in raw:
                log.error("fault injection: poison request received, event loop blocked")
                _block_forever()
            if fault.mode is FaultMode.ENGINE_ERROR:
                return web.Response(body=orjson.dumps(_ENGINE_ERROR), status=500, content_type=_JSON)
            # A big body is decoded and tokenized off the event loop: one request never stalls
            # the others (or /health) for the seconds a multi-megabyte prompt takes.
            if len(raw) > _OFFLOOP_BYTES:
                job = await asyncio.to_thread(_parse_job, raw, kind, svc.cfg.max_model_len)
            else:
                job = _parse_job(raw, kind, svc.cfg.max_model_len)
            rid = fl.request_id(header_rid, job)
            fl.check_model(svc, job.model)
            svc.check_logprobs(job)
            plan = await fl.plan(svc, job, rid)
        except ApiError as err:
            return self._error(err, headers)
        if plan.fallback_reason is not None:
            headers["x-motor-sim-kv-fallback"] = "1"
        run = Run(rid, job, plan)
        ids = responses.Ids(fl.response_id(rid, kind), svc.cfg.primary_name)
        if plan.kv_load_failed is not None:
            return await self._kv_load_failed(request, run, ids, headers)
        gen = svc.generate(run)
        async with contextlib.aclosing(gen):
            try:
                first = await anext(gen)
            except ApiError as err:
                return self._error(err, headers)
            except TransferError as exc:
                return self._error(fl.transfer_failed(rid, job, exc), headers)
            if not job.stream:
                async for _ in gen:
                    pass
                if run.completion_tokens * (1 + max(job.logprobs or 0, 0)) > _OFFLOOP_TOKENS:
                    data = await asyncio.to_thread(_full_body, fl, svc, run, ids)
                else:
                    data = _full_body(fl, svc, run, ids)
                return web.Response(body=data, content_type=_JSON, headers=headers)
            resp = web.StreamResponse(headers=headers)
            resp.content_type = "text/event-stream"
            resp.charset = "utf-8"
            resp.headers["Cache-Control"] = "no-cache"
            await resp.prepare(request)
            if svc.fault.mode is FaultMode.FREEZE_AFTER_HEAD:
                log.error("fault injection: a stream's head sent, event loop blocked")
                _block_forever()
            if kind == "chat":
                for i in range(job.n):
                    role = {"id": ids.response_id, "object": "chat.completion.chunk",
                            "created": run.created, "model": ids.model,
                            "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}]}
                    await resp.write(_sse(fl.shape(svc, run, role, "role")))
            steps = first
            while True:
                out = b"".join(_sse(fl.shape(svc, run, c, "chunk"))
                               for c in responses.chunk(run, ids, fl, steps, False))
                if out:
                    await resp.write(out)
                nxt = await anext(gen, None)
                if nxt is None:
                    break
                steps = nxt
            tail = _DONE
            if job.include_usage:
                tail = _sse(fl.shape(svc, run, responses.usage_chunk(run, ids), "usage")) + _DONE
            await resp.write(tail)
            await resp.write_eof()
            return resp

    async def _kv_load_failed(self, request: web.Request, run: Run, ids: responses.Ids,
                              headers: dict[str, str]) -> web.StreamResponse:
        """vLLM 0.32, kv_load_failure_policy "fail": the request finishes with reason ``error``;
        the API server answers 500 "Internal server error", or, streamed (headers already sent),
        chat's role chunk, then the error object as an event, then ``[DONE]``."""
        err = {"error": {"message": "Internal server error", "type": "InternalServerError",
                         "param": None, "code": 500}}
        if not run.job.stream:  # FastAPI's JSONResponse: compact
            return web.Response(body=orjson.dumps(err), status=500, content_type=_JSON, headers=headers)
        text = json.dumps(err).encode()  # in a stream vLLM renders it with json.dumps (", " and ": ")
        resp = web.StreamResponse(headers=headers)
        resp.content_type = "text/event-stream"
        resp.charset = "utf-8"
        resp.headers["Cache-Control"] = "no-cache"
        await resp.prepare(request)
        out = b""
        if run.job.kind == "chat":
            for i in range(run.job.n):
                role = {"id": ids.response_id, "object": "chat.completion.chunk", "created": run.created,
                        "model": ids.model, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                         "logprobs": None, "finish_reason": None}]}  # fmt: skip
                out += _sse(self.flavour.shape(self.svc, run, role, "role"))
        await resp.write(out + b"data: " + text + b"\n\n" + _DONE)
        await resp.write_eof()
        return resp

    # ---- vLLM's other routes (vllm_extra.py) ----------------------------------------------------
    async def _json_body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, f"Invalid JSON body: {exc}") from exc
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        self.flavour.check_model(self.svc, body.get("model"))
        return body

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            out = vllm_extra.tokenize(await self._json_body(request), self.cfg.max_model_len)
        except ApiError as err:
            return self._error(err)
        return web.Response(body=orjson.dumps(out), content_type=_JSON)

    async def detokenize(self, request: web.Request) -> web.Response:
        try:
            out = vllm_extra.detokenize(await self._json_body(request))
        except ApiError as err:
            return self._error(err)
        return web.Response(body=orjson.dumps(out), content_type=_JSON)

    async def embeddings(self, request: web.Request) -> web.Response:
        try:
            body = await self._json_body(request)
            out = vllm_extra.embeddings(body, body.get("model") or self.cfg.primary_name, self.cfg.max_model_len)
        except ApiError as err:
            return self._error(err)
        return web.Response(body=orjson.dumps(out), content_type=_JSON)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """/v1/responses: the input as chat messages, generated like a chat request. With the store
        on (VLLM_ENABLE_RESPONSES_API_STORE=1) a ``store`` answer is kept for retrieve/cancel and
        ``background`` answers ``queued`` at once and generates in a task, as vLLM does."""
        fl, svc, store = self.flavour, self.svc, self.response_store
        try:
            body = await self._json_body(request)
            chat = vllm_extra.responses_to_chat(body)
            vllm_extra.check_store_options(body, store)
            job = _parse_job(orjson.dumps(chat), "chat", svc.cfg.max_model_len)
            rid = fl.request_id(request.headers.get("X-Request-Id"), job)
            svc.check_logprobs(job)
            plan = await fl.plan(svc, job, rid)
            run = Run(rid, job, plan)
            model = body.get("model") or svc.cfg.primary_name
            keep = store.enabled and body.get("store", True) is not False
            response_id = vllm_extra.new_response_id(body)
            if body.get("background"):
                queued = vllm_extra.response_object(body, model, "", None, 0, 0, 0, response_id=response_id)
                queued.update(status="queued", output=[], usage=None, incomplete_details=None)
                store.put(queued)
                task = self._background[response_id] = self._spawn(self._in_background(run, body, model, queued))
                task.add_done_callback(lambda _: self._background.pop(response_id, None))
                return web.Response(body=orjson.dumps(queued), content_type=_JSON)
            if body.get("stream"):
                events = vllm_extra.ResponseEvents(body, model, response_id)
                resp = await self._stream_response(request, run, events)
                if keep and events.final is not None:
                    store.finish(events.final)
                return resp
            async with contextlib.aclosing(svc.generate(run)) as gen:
                async for _ in gen:
                    pass
        except ApiError as err:
            return self._error(err)
        except TransferError as exc:
            return self._error(fl.transfer_failed(rid, job, exc))
        out = self._finished_response(run, body, model, response_id)
        if keep:
            store.finish(out)
        return web.Response(body=orjson.dumps(out), content_type=_JSON)

    @staticmethod
    def _finished_response(run: Run, body: dict[str, Any], model: str, response_id: str) -> dict[str, Any]:
        d = run.decoders[0]
        return vllm_extra.response_object(body, model, d.text, d.finish_reason, run.prompt_tokens,
                                          run.completion_tokens, run.cached_tokens, response_id=response_id)

    async def _in_background(self, run: Run, body: dict[str, Any], model: str, held: dict[str, Any]) -> None:
        """A background response's generation; its stored object turns in_progress, then the
        finished answer (unless cancelled), or failed."""
        held["status"] = "in_progress"
        try:
            async with contextlib.aclosing(self.svc.generate(run)) as gen:
                async for _ in gen:
                    pass
        except ApiError:
            if held["status"] not in ("completed", "cancelled"):
                held["status"] = "failed"
            return
        self.response_store.finish(self._finished_response(run, body, model, held["id"]))

    async def retrieve_response(self, request: web.Request) -> web.Response:
        """GET /v1/responses/{id}: the stored response, or vLLM's 404. ``stream=true`` replays the
        events of a background stream in vLLM, which the simulator does not keep: vLLM's 400 for
        an id without events."""
        response_id = request.match_info["response_id"]
        try:
            found = self.response_store.get(response_id)
            if request.query.get("stream", "").lower() in ("true", "1"):
                raise ApiError(400, f"Unknown response_id: {response_id}", param="response_id", value=response_id)
        except ApiError as err:
            return self._error(err)
        return web.Response(body=orjson.dumps(found), content_type=_JSON)

    async def cancel_response(self, request: web.Request) -> web.Response:
        """POST /v1/responses/{id}/cancel: a queued or in-progress background response is
        cancelled (its generation stopped); vLLM's 404 / 400 otherwise."""
        response_id = request.match_info["response_id"]
        try:
            found = self.response_store.cancel(response_id)
        except ApiError as err:
            return self._error(err)
        task = self._background.get(response_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return web.Response(body=orjson.dumps(found), content_type=_JSON)

    async def _stream_response(self, request: web.Request, run: Run,
                               events: vllm_extra.ResponseEvents) -> web.StreamResponse:
        """A streamed /v1/responses answer: vLLM's events around the generated tokens."""
        async with contextlib.aclosing(self.svc.generate(run)) as gen:
            first = await anext(gen)  # errors before the head are still a plain error answer
            resp = web.StreamResponse()
            resp.content_type = "text/event-stream"
            resp.charset = "utf-8"
            await resp.prepare(request)
            await resp.write(events.opening())
            steps: list[Any] | None = first
            while steps is not None:
                out = b"".join(events.delta(step.text) for idx, step in steps if idx == 0)
                if out:
                    await resp.write(out)
                steps = await anext(gen, None)
        d = run.decoders[0]
        await resp.write(events.closing(d.finish_reason, run.prompt_tokens, run.completion_tokens, run.cached_tokens))
        await resp.write_eof()
        return resp

    async def models(self, request: web.Request) -> web.Response:
        data = [self.flavour.model_card(self.svc, n) for n in self.cfg.served_model_names]
        return web.Response(body=orjson.dumps({"object": "list", "data": data}), content_type=_JSON)

    async def health(self, request: web.Request) -> web.Response:
        if self.svc.fault.mode is FaultMode.HEALTH_503:
            return web.Response(status=503)
        if self.svc.fault.mode is FaultMode.SLOW_HEALTH:
            await asyncio.sleep(self.svc.fault.delay_s)
        if self._dp_group is not None and not self._dp_group.formed:
            return web.Response(status=503)  # like vLLM: DP ranks handshake before the engine is up
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=render(self.registry),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def version(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps({"version": self.cfg.version}), content_type=_JSON)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": self.cfg.model, "tokenizer_path": self.cfg.model,
                                  "is_generation": True}, dumps=lambda o: orjson.dumps(o).decode())

    async def server_info(self, request: web.Request) -> web.Response:
        c = self.cfg
        info = {"model_path": c.model, "served_model_name": c.primary_name, "host": c.host,
                "port": c.port, "disaggregation_mode": "null" if c.role is Role.UNION else c.role.value,
                "disaggregation_bootstrap_port": c.bootstrap_port,
                "disaggregation_transfer_backend": c.transfer_backend, "dp_size": c.dp_size,
                "tp_size": c.tp_size, "max_running_requests": c.max_num_seqs, "version": c.version}
        return web.Response(body=orjson.dumps(info), content_type=_JSON)

    # ---- admin -----------------------------------------------------------------------------
    async def sim_fault(self, request: web.Request) -> web.Response:
        try:
            fault = parse_fault(orjson.loads(await request.read() or b"{}"))
        except (InvalidFault, orjson.JSONDecodeError) as exc:
            return web.Response(body=orjson.dumps({"error": str(exc)}), status=400,
                                content_type=_JSON)
        self.apply_fault(fault)
        return web.Response(body=orjson.dumps({"fault": fault.to_json()}), content_type=_JSON)

    def apply_fault(self, fault: Fault) -> None:
        log.warning("fault injection: %s", fault.mode.value)
        self.svc.set_fault(fault)
        if fault.mode is FaultMode.HANG:
            self._not_hanging.clear()
            if fault.hard:
                asyncio.get_running_loop().call_later(0.05, _block_forever)
        else:
            self._not_hanging.set()
        if self._zmq is not None:
            self._zmq.poke()
        if fault.mode is FaultMode.CRASH:
            self._spawn(self._crash(fault))

    async def _crash(self, fault: Fault) -> None:
        await asyncio.sleep(max(fault.delay_s, 0.05))
        if self._zmq is not None:
            await self._zmq.publish_now()
        log.error("fault injection: crashing with exit code %d", fault.exit_code)
        logging.shutdown()
        os._exit(fault.exit_code)

    def state(self, request: web.Request | None = None) -> dict[str, Any]:
        svc, c = self.svc, self.cfg
        nodelay: bool | None = None
        if request is not None and request.transport is not None:
            sock = request.transport.get_extra_info("socket")
            if sock is not None:
                nodelay = bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        st = svc.stats
        return {
            "flavour": c.flavour.value, "role": c.role.value, "model": c.model,
            "served_model_names": list(c.served_model_names), "engine_id": svc.engine_id,
            "pid": os.getpid(), "port": self.port, "dp_rank": c.dp_rank, "dp_size": c.dp_size,
            "tp_size": c.tp_size, "active_dp_ranks": self.active_dp_ranks,
            "side_channel": {"host": c.side_channel_host, "port": c.side_channel_port}
            if c.flavour is FlavourName.VLLM and c.is_producer else None,
            "bootstrap_port": c.bootstrap_port
            if c.flavour is FlavourName.SGLANG and c.role is Role.PREFILL else None,
            "fault": svc.fault.to_json(), "zero_latency": c.cost.zero_latency,
            "running": svc.engine.num_running, "waiting": svc.engine.num_waiting,
            "kv": {"num_blocks": svc.blocks.num_blocks, "used": svc.blocks.num_used,
                   "usage": svc.blocks.usage, "prefix_queries": svc.blocks.prefix_queries,
                   "prefix_hits": svc.blocks.prefix_hits, "leases": len(svc.leases),
                   "rooms": len(svc.rooms)},
            "stats": dict(vars(st)), "tcp_nodelay": nodelay,
            "trace_headers": list(self.trace_headers), "responses": self.response_store.to_json(),
        }

    async def sim_state(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(self.state(request)), content_type=_JSON)

    # ---- fault tolerance (vLLM) ------------------------------------------------------------
    def _ft_status(self) -> dict[str, Any]:
        status = self.svc.fault.health_status
        reason = self.svc.fault.mode.value
        unresolved = sorted(self._dp_group.lost - set(self._removed)) if self._dp_group is not None else []
        if status == "healthy" and unresolved:
            status, reason = "unhealthy", f"dp peer rank(s) {unresolved} lost"
        elif status == "healthy" and time.monotonic() < self._reconfig_until:
            status, reason = "unhealthy", "reconfiguring after scale_down"
        return {"status": status, "dp_rank": self.cfg.dp_rank, "dp_size": len(self.active_dp_ranks),
                "active_dp_ranks": self.active_dp_ranks, "engine_id": self.svc.engine_id,
                "reason": reason}

    @property
    def _removed(self) -> list[int]:
        return [r for r in range(self.cfg.dp_size) if r not in self.active_dp_ranks]

    async def ft_status(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(self._ft_status()), content_type=_JSON)

    async def ft_apply(self, request: web.Request) -> web.Response:
        """vLLM's contract: ``{"instruction": "scale_down" | "retry", "params": {...}}`` → 202 Accepted
        with a request id; the engine then reconfigures asynchronously (``/fault_tolerance/status``
        says ``unhealthy`` meanwhile). ``scale_down`` params: ``dead_ranks`` (DP ranks to remove)."""
        try:
            body = orjson.loads(await request.read() or b"{}")
        except orjson.JSONDecodeError as exc:
            return self._error(ApiError(400, f"Invalid JSON format: {exc}"))
        instruction = body.get("instruction") if isinstance(body, dict) else None
        params = body.get("params", {}) if isinstance(body, dict) else None
        if instruction not in ("scale_down", "retry") or not isinstance(params, dict):
            return self._error(ApiError(400, "instruction must be 'scale_down' or 'retry' with object params",
                                        param="instruction"))  # fmt: skip
        if instruction == "scale_down":
            dead = params.get("dead_ranks")
            if not isinstance(dead, list) or not dead or not all(
                isinstance(r, int) and 0 <= r < self.cfg.dp_size and r != self.cfg.dp_rank for r in dead
            ):
                return self._error(ApiError(400, "params.dead_ranks must list other dp ranks", param="dead_ranks"))
            self.active_dp_ranks = [r for r in self.active_dp_ranks if r not in set(dead)]
            self._reconfig_until = time.monotonic() + 0.3
            log.warning("fault tolerance: scale_down %s -> active dp ranks %s", sorted(dead), self.active_dp_ranks)
            self._spawn(self._publish_after(0.35))
        if self._zmq is not None:
            self._zmq.poke()
        return web.Response(body=orjson.dumps({"request_id": uuid.uuid4().hex, "instruction": instruction}),
                            status=202, content_type=_JSON)  # fmt: skip

    async def _publish_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        if self._zmq is not None:
            self._zmq.poke()

    def _on_group_change(self) -> None:
        if self._zmq is not None:
            self._zmq.poke()

    # ---- life cycle ------------------------------------------------------------------------
    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _sweep_leases(self) -> None:
        period = max(0.05, min(1.0, self.cfg.kv_lease_s / 4))
        while True:
            await asyncio.sleep(period)
            self.svc.sweep_leases()

    async def start(self) -> None:
        c = self.cfg
        if c.flavour is FlavourName.VLLM and c.kv_transfer_config is not None and c.is_producer:
            fs = framing.FrameServer(side_channel.make_handler(self.svc), "nixl-side-channel")
            await fs.start(c.side_channel_host if c.host != "0.0.0.0" else "0.0.0.0",
                           c.side_channel_port)
            self._frame_servers.append(fs)
            log.info("NIXL side channel listening on %s:%d", c.side_channel_host,
                     c.side_channel_port)
            self._spawn(self._sweep_leases())
        if c.flavour is FlavourName.SGLANG and c.role is Role.PREFILL:
            fs = framing.FrameServer(bootstrap.make_handler(self.svc), "bootstrap")
            await fs.start(c.host, c.bootstrap_port)
            self._frame_servers.append(fs)
            log.info("bootstrap server listening on %s:%d", c.host, c.bootstrap_port)
        if c.kv_events is not None:
            self.kv_events = KvEventPublisher(EventFlavour(c.flavour.value), c.kv_events,
                                              self.svc.blocks.take_events, c.dp_rank)
            self.svc.blocks.on_events = self.kv_events.poke
            self.kv_events.start()
            log.info("KV events published on %s (replay %s)", *self.kv_events.endpoints)
        if c.zmq_pub_port is not None:
            self._zmq = FaultPublisher(c.host, c.zmq_pub_port + c.dp_rank, self._ft_status,
                                       c.zmq_interval_s)
            self._zmq.start()
            if c.flavour is FlavourName.VLLM and c.dp_size > 1 and c.dp_rpc_port:
                self._dp_group = DpGroup(c.dp_address or "127.0.0.1", c.dp_rpc_port, c.dp_rank, c.dp_size,
                                         self._on_group_change)  # fmt: skip
                await self._dp_group.start()
        self._runner = web.AppRunner(self.make_app(), handler_cancellation=True, access_log=None,
                                     keepalive_timeout=c.keepalive_s)
        await self._runner.setup()
        site = web.TCPSite(self._runner, c.host, c.port, backlog=2048, reuse_address=True)
        await site.start()
        server = getattr(site, "_server", None)
        if c.port == 0 and server is not None and server.sockets:
            self.port = int(server.sockets[0].getsockname()[1])
        if c.crash_after_s is not None:
            self.apply_fault(Fault(FaultMode.CRASH, delay_s=c.crash_after_s))
        log.info("motor-sim %s (%s) serving %s on http://%s:%d", c.flavour.value, c.role.value,
                 c.primary_name, c.host, self.port)
        log.info("Application startup complete.")

    async def stop(self) -> None:
        self._not_hanging.set()
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for fs in self._frame_servers:
            await fs.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._zmq is not None:
            await self._zmq.close()
        if self.kv_events is not None:
            await self.kv_events.close()
        if self._dp_group is not None:
            await self._dp_group.close()
        for lease in self.svc.leases.drain():
            self.svc.release_lease(lease)


def _block_forever() -> None:
    log.error("fault injection: hard hang, event loop blocked")
    while True:
        time.sleep(3600)


async def serve(cfg: SimConfig) -> int:
    """Run until SIGTERM/SIGINT; returns the process exit code."""
    server = SimServer(cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if cfg.ignore_sigterm:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        log.warning("fault injection: SIGTERM is ignored")
    try:
        await server.start()
    except OSError as exc:
        log.error("cannot start: %s", exc)
        await server.stop()
        return 1
    if cfg.initial_fault not in ("none", "refuse_start"):
        server.apply_fault(Fault(FaultMode(cfg.initial_fault)))
    await stop.wait()
    log.info("shutting down")
    await server.stop()
    return 0
