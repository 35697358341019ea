"""Runs one request through prefill→decode (or both at once, or a union endpoint) and yields a
:class:`Head` followed by the engine's body bytes, unchanged.

Errors before the head are ``MotorError``s (the servicer turns them into gRPC statuses); engine 4xx
answers are relayed as head + body. After the head, a broken engine stream ends the call with
UNAVAILABLE (reason ENGINE_STREAM_BROKEN).

A sequential (vLLM) decode whose answer says the KV hand-off failed (its adapter reads the first
bytes: a NIXL handshake or transfer that failed under ``kv_load_failure_policy: fail``) is run
again before the client saw a byte — a fresh prefill and another decode, each when one is
schedulable, else the same one (whose retried NIXL handshake usually succeeds) — at most
``dispatch.kv_load_retries`` times; then the decode's own answer is relayed.

Every attempt waits for its engine's first byte under a watchdog: when the engine gives no sign of
life for ``first_byte_timeout_sec`` the attempt has stalled. Whether a stalled or dropped attempt
is sent to another engine is decided by ``liveness.Liveness`` (innocent: yes) and, for a stalled
suspect, by ``quarantine.Quarantine``: the suspects of one hung engine are paroled to other
engines one at a time, and one that stalls a second engine is convicted — refused as poison,
FAILED_PRECONDITION ``POISON_REQUEST_SUSPECTED`` (``dispatch.parole_suspects`` off: every stalled
suspect is). A dropped suspect gets one more engine.

Mid-stream migration (``dispatch.migration_budget`` continuations per request): when an engine dies
after the head, a stream continues on another engine — re-prefilled with the prompt plus the text
already sent (``migration.StreamTracker``), its events rewritten into the original stream — and a
non-streamed answer (nothing of it reached the client yet) is run again from the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import aiohttp
import orjson

from motor_common.domain import Endpoint, EngineType, Role
from motor_common.errors import FailedPrecondition, NotFound, Unavailable
from motor_common.logs import request_id_var
from motor_common.openai_front.openai import public_engine_error
from motor_common.tracing import Parent
from motor_coordinator import engine_client, metrics, passthrough
from motor_coordinator.adapters import EngineAdapter
from motor_coordinator.config import DispatchConfig
from motor_coordinator.dispatch_trace import DispatchTrace, EngineCall, RetryReason
from motor_coordinator.engine_client import (
    AnswerTooLarge,
    EngineClient,
    EngineUnreachable,
    read_body,
)
from motor_coordinator.engine_http import EngineResponse
from motor_coordinator.liveness import Attempt, Key
from motor_coordinator.migration import MAX_PENDING_EVENT_BYTES, StreamTracker, migratable
from motor_coordinator.policies import Candidate, RequestInfo
from motor_coordinator.quarantine import Quarantine, Turn
from motor_coordinator.request import PASSTHROUGH, RESPONSES, VERSION, ParsedRequest, prompt_prefix
from motor_coordinator.response_homes import (
    MAX_FIRST_EVENT_BYTES,
    MAX_JSON_BYTES,
    ResponseHomes,
    probe_order,
    response_id_of,
)
from motor_coordinator.scheduler import EndpointKey, Route, Scheduler, endpoint_key
from motor_coordinator.tokenize_offload import TokenizeOffload

log = logging.getLogger(__name__)
JSON = "application/json"
SSE = "text/event-stream"
# How much of an engine's error answer goes to the log (the client gets a public message instead).
ENGINE_ERROR_LOG_BYTES = 4096


@dataclass(frozen=True)
class Head:
    http_status: int
    content_type: str
    request_id: str
    prefill_instance_id: int = 0
    decode_instance_id: int = 0


Frame = Head | bytes


@dataclass(frozen=True)
class _Answer:
    """A complete engine answer (prefill replies, relayed errors)."""

    status: int
    content_type: str
    body: bytes


class _PrefillFailed(Exception):
    def __init__(self, message: str, reason: RetryReason, *, answered: bool = True) -> None:
        super().__init__(message)
        self.reason: RetryReason = reason
        # False: the engine sent no answer at all (no connection, or dropped before a head)
        self.answered = answered


class _DecodeAlone(Exception):
    """Every prefill tried was unreachable (none took the request) and no other may be tried: a
    vLLM decode computes the request whole (``scheduler.decode_only_fallback``)."""


class _Stalled(Exception):
    """The engine gave no sign of life for the first-byte (or inter-token) deadline while the
    attempt waited for its first (or next) byte."""


_T = TypeVar("_T")
# Silence (no sign of life from the engine) after which a waiting attempt has its engine probed at
# once: a healthy engine answers a probe in milliseconds, a hung one is then proven hung early.
_PROBE_AFTER = 0.05


class _Fate:
    """What one request's failed attempts allow (see ``liveness``): a stall it may have caused
    ends it; so does a second engine dropping it."""

    __slots__ = ("drops", "model", "parole", "parole_role", "paroled", "rid", "trace")

    def __init__(self, model: str, rid: str, trace: DispatchTrace) -> None:
        self.model = model
        self.rid = rid
        self.drops = 0
        self.trace = trace  # spans and phase metrics of this request (dispatch_trace)
        self.parole: int | None = None  # its quarantine ticket while it is on parole
        self.parole_role = ""  # the role of the engine it hung (only an answer of that role clears it)
        self.paroled = False  # it was on parole once (a request is paroled at most once)

    def poison(self, what: str, detail: str) -> FailedPrecondition:
        """The refusal: *what* happened, for the client; *detail* (engine addresses) only in the log."""
        metrics.POISON_REQUESTS.labels(self.model).inc()
        log.error("poison-request containment: request %s is not sent to another engine: %s", self.rid, detail)
        return FailedPrecondition(
            f"request {self.rid} was not completed: {what}. It is not sent to another engine, because "
            "it may be what stopped that one (poison-request containment). If the request is valid, "
            "send it again later; if it keeps failing, check its parameters.",
            reason="POISON_REQUEST_SUSPECTED",
            metadata={"model": self.model},
        )


class Dispatcher:
    def __init__(
        self,
        scheduler: Scheduler,
        client: EngineClient,
        adapters: dict[Any, EngineAdapter],
        cfg: DispatchConfig,
        *,
        prefix_chars: int = 256,
        token_ids: Callable[[ParsedRequest], tuple[int, ...] | None] | None = None,
        tokenize_offload: TokenizeOffload | None = None,
    ) -> None:
        self.scheduler = scheduler
        # The prompt's token ids for policies that hash them (kv_events); None: not computed.
        self.token_ids = token_ids
        # Where long prompts are tokenized (a worker thread); None: always on the event loop.
        self.tokenize_offload = tokenize_offload
        self.client = client
        self.adapters = adapters
        self.cfg = cfg
        self.prefix_chars = prefix_chars
        self._seq = itertools.count()
        # Probe an engine now (the app wires Monitor.probe_now); None: only the periodic probes.
        self.probe_now: Callable[[Endpoint], None] | None = None
        self.quarantine = Quarantine()
        # where the stored /v1/responses answers live (response_homes.py)
        self.response_homes: ResponseHomes[EndpointKey] = ResponseHomes()
        self._turns: dict[int, asyncio.Future[None]] = {}  # quarantine tickets waiting for their turn

    async def dispatch(self, req: ParsedRequest, request_id: str, *, trace: Parent = ()) -> AsyncIterator[Frame]:
        """*trace*: the caller's span or the trace headers it received (``motor_common.tracing``)."""
        fate = _Fate(req.model, request_id, DispatchTrace(req.model, request_id, trace, stream=req.stream))
        stream: AsyncGenerator[Frame, None]
        passthrough = req.api in PASSTHROUGH
        migrating = not passthrough and self.cfg.migration_budget > 0 and (
            not req.stream or migratable(req.api, req.body))
        if passthrough:
            stream = self._passthrough(req, request_id, fate)
        elif migrating:
            stream = self._migrating(req, request_id, fate)
        else:
            stream = self._once(req, request_id, fate)
        error: BaseException | None = None
        try:
            async with contextlib.aclosing(stream):
                async for frame in stream:
                    yield frame
        except Unavailable as exc:
            error = exc
            if migrating or passthrough or exc.reason != "ENGINE_STREAM_BROKEN" or not req.stream:
                raise
            why = ("mid-stream migration is off (dispatch.migration_budget 0)" if self.cfg.migration_budget == 0
                   else "a continuation of this request would not equal an uninterrupted answer (it uses n > 1, "
                   "best_of, logprobs, echo, suffix, stop strings, stop_token_ids, tools or a token prompt)")
            # a message written for the client (the gateway relays STREAM_NOT_CONTINUED's as it is)
            error = Unavailable(f"{exc.message}. The stream was not continued on another engine: {why}; "
                                "send the request again", reason="STREAM_NOT_CONTINUED")
            raise error from exc
        except BaseException as exc:
            error = exc
            raise
        finally:
            fate.trace.end(error)
            if fate.parole is not None:  # it ended without a verdict: the next suspect's turn
                self._wake(self.quarantine.cleared(fate.parole))
                fate.parole = None

    async def _once(self, req: ParsedRequest, request_id: str, fate: _Fate) -> AsyncGenerator[Frame, None]:
        ids = await self._prompt_ids(req)
        info = RequestInfo(next(self._seq), req.model, prompt_prefix(req, self.prefix_chars), ids)
        route = self.scheduler.route(info)
        if route.union is not None:
            stream = self._union(req, route.union, info, request_id, fate)
        elif route.decode_only:
            assert route.decode is not None
            stream = self._union(req, route.decode, info, request_id, fate, Role.DECODE)
        elif route.prefill_only:
            assert route.prefill is not None
            stream = self._union(req, route.prefill, info, request_id, fate, Role.PREFILL)
        elif self.adapters[route.engine].concurrent:
            stream = self._concurrent(req, route, info, request_id, fate)
        else:
            stream = self._sequential(req, route, info, request_id, fate)
        async for frame in stream:
            yield frame

    async def _prompt_ids(self, req: ParsedRequest) -> tuple[int, ...] | None:
        if self.token_ids is None:
            return None
        if self.tokenize_offload is not None and self.tokenize_offload.wants(req):
            return await self.tokenize_offload.run(self.token_ids, req)
        return self.token_ids(req)

    async def _migrating(self, req: ParsedRequest, rid: str, fate: _Fate) -> AsyncGenerator[Frame, None]:
        """:meth:`_once`, continued on another engine when its engine dies mid-answer."""
        tracker = StreamTracker(req.api) if req.stream else None
        current = req
        migrations = 0
        head: Head | None = None  # the head the client got
        held: Head | None = None  # a non-streamed answer's head, until its body arrived
        plain = False  # not a 200 SSE stream: relayed unchanged, never continued
        while True:
            try:
                async with contextlib.aclosing(self._once(current, rid, fate)) as frames:
                    async for frame in frames:
                        if isinstance(frame, Head):
                            if head is not None:  # a continuation's own head
                                if frame.http_status != 200 or not frame.content_type.startswith(SSE):
                                    raise Unavailable(
                                        f"the continuation of request {rid} on another engine was refused "
                                        f"(HTTP {frame.http_status})", reason="ENGINE_STREAM_BROKEN")
                                continue
                            if tracker is None:
                                held = frame
                                continue
                            head = frame
                            plain = frame.http_status != 200 or not frame.content_type.startswith(SSE)
                            yield frame
                        elif tracker is None:
                            if held is not None:
                                head, held = held, None
                                yield head
                            yield frame
                        elif plain:
                            yield frame
                        else:
                            tracking = tracker.tracking
                            out = tracker.feed(frame) if current is req else tracker.rewrite(frame)
                            if out:
                                yield out
                            if tracking and not tracker.tracking:
                                log.warning("request %s: an SSE event of its engine's stream passed %d bytes; the "
                                            "rest is relayed as it comes and cannot be continued on another engine",
                                            rid, MAX_PENDING_EVENT_BYTES)
                if tracker is not None and head is not None and not plain:
                    # what an engine sent after its last blank line (an unterminated last event)
                    out = tracker.feed(b"", end=True) if current is req else tracker.rewrite(b"", end=True)
                    if out:
                        yield out
                if held is not None:
                    yield held
                return
            except Unavailable as exc:
                if (exc.reason != "ENGINE_STREAM_BROKEN" or plain or migrations >= self.cfg.migration_budget
                        or (tracker is not None and not tracker.tracking)):
                    raise
                fate.drops += 1
                if fate.drops >= 2:
                    raise fate.poison(f"{fate.drops} engines died while serving it",
                                      f"{fate.drops} engines died under it: {exc.message}") from exc
                migrations += 1
                held = None
                if tracker is None or head is None:
                    current = req  # nothing of the answer reached the client: run it again
                else:
                    cont = tracker.continuation(req.body)
                    if cont is None:  # everything was generated; only the end was lost
                        tail = tracker.tail()
                        if tail:
                            yield tail
                        return
                    current = ParsedRequest(req.api, cont, req.model, req.stream)
                metrics.MIGRATIONS.labels(req.model).inc()
                fate.trace.migrated(migrations)
                log.warning("request %s: its engine died mid-answer (%s); continuing on another engine (%d/%d)",
                            rid, exc.message, migrations, self.cfg.migration_budget)

    # -- helpers ------------------------------------------------------------------------------

    def _next(self, role: Role, info: RequestInfo, route: Route, tried: list[EndpointKey]) -> Candidate | None:
        return self.scheduler.pick(role, info, engine=route.engine, exclude=tried)

    def _exhausted(self, role: str, req: ParsedRequest, tried: int, last: str) -> Unavailable:
        """The client's error names no engine address or exception: those go to the log."""
        rid = request_id_var.get()
        log.warning("%s failed on %d endpoint(s) for model %r (request id %s): %s", role, tried, req.model, rid, last)
        return Unavailable(
            f"{role} failed on {tried} {role} endpoint(s) for model {req.model!r}; retry later "
            f"(the coordinator log has the details under request id {rid})",
            reason=f"{role.upper()}_FAILED",
            metadata={"model": req.model, "role": role},
        )

    async def _watch(self, a: Attempt, cand: Candidate, aw: Awaitable[_T]) -> _T:
        """Await *aw* (the engine's first answer to attempt *a*); raise :class:`_Stalled` once the
        engine has given no sign of life for ``first_byte_timeout_sec`` meanwhile. After
        ``_PROBE_AFTER`` of silence the engine is probed at once (``probe_now``).

        *aw* runs in the caller's task; a timer checks the silence and, on a stall, cancels the
        task (no task, no ``asyncio.wait`` per attempt: this runs twice per request)."""
        live = self.scheduler.liveness
        limit = self.cfg.first_byte_timeout_sec
        probed = self.probe_now is None
        stalled = False
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        handle: asyncio.TimerHandle | None = None

        def next_check() -> float | None:
            """Seconds until the next look at the engine's silence; None: it has stalled."""
            nonlocal probed
            silent = live.silent_for(a)
            left = limit - silent
            if left <= 0:
                return None
            if not probed and silent >= _PROBE_AFTER:
                probed = True
                assert self.probe_now is not None
                self.probe_now(cand.endpoint)
            return left if probed else min(left, _PROBE_AFTER - silent)

        def check() -> None:
            nonlocal handle, stalled
            wait = next_check()
            if wait is None:
                stalled = True
                task.cancel()
            else:
                handle = loop.call_later(wait, check)

        first = next_check()
        if first is None:
            if asyncio.iscoroutine(aw):
                aw.close()  # never sent
            raise _Stalled()
        handle = loop.call_later(first, check)
        try:
            result = await aw
        except BaseException:
            if stalled and task.uncancel() == 0:  # only the watchdog's cancel: the engine stalled
                raise _Stalled() from None
            raise
        finally:
            handle.cancel()  # the last one scheduled (check() replaces it)
        if stalled:  # answered although cancelled: the answer counts, the cancel is taken back
            task.uncancel()
        return result

    async def _attempt(
        self, cand: Candidate, role: str, fate: _Fate, aw: Awaitable[_T]
    ) -> _T:
        """One attempt on *cand*'s engine under the first-byte watchdog. Raises ``EngineUnreachable``
        (retry elsewhere), or the poison refusal when the request must not go to another engine."""
        live = self.scheduler.liveness
        a = live.sent(endpoint_key(cand.endpoint))
        try:
            # Without health probes an idle engine shows no sign of life while it works on a long
            # request: the watchdog could not tell slow from hung, so it is off.
            result = await (self._watch(a, cand, aw) if self.cfg.health_probe_interval_sec > 0 else aw)
        except _Stalled:
            innocent = live.innocent(a)
            metrics.ENGINE_STALLS.labels(role).inc()
            self.scheduler.trip(cand.endpoint)
            what = (f"{role} engine {cand.endpoint.host_port} gave no sign of life for "
                    f"{self.cfg.first_byte_timeout_sec:g}s while serving it")
            if innocent:
                log.warning("%s; request %s arrived after it went silent (or a convicted request hung it): "
                            "retrying on another engine", what, fate.rid)
            else:
                await self._suspect(fate, a.key, role, what)
            raise EngineUnreachable(cand.endpoint, "stalled (no sign of life)", reached=False) from None
        except EngineUnreachable as exc:
            if exc.reached and not live.innocent(a):
                if fate.parole is not None:
                    self._convict(fate, a.key, f"{role} engine {cand.endpoint.host_port} dropped it on parole")
                    raise fate.poison("it hung one engine and a second one dropped the connection while serving it",
                                      f"on parole, {role} engine {cand.endpoint.host_port} dropped it") from exc
                fate.drops += 1
                if fate.drops >= 2:
                    raise fate.poison(f"{fate.drops} engines dropped the connection while serving it",
                                      f"{fate.drops} engines dropped it, the last {cand.endpoint.host_port}") from exc
            raise
        live.alive(a.key)
        if fate.parole is not None and role == fate.parole_role:  # answered elsewhere: a victim, not the poison
            metrics.POISON_SUSPECTS.labels(fate.model, "cleared").inc()
            self._wake(self.quarantine.cleared(fate.parole))
            fate.parole = None
        return result

    # -- quarantine (quarantine.py) ------------------------------------------------------------

    async def _suspect(self, fate: _Fate, key: Key, role: str, what: str) -> None:
        """A suspect's attempt stalled on engine *key*. Return when it may go to another engine
        (its group's turn, or freed as a victim); raise the poison refusal otherwise."""
        timeout = self.cfg.first_byte_timeout_sec
        if fate.parole is not None:  # its second hung engine
            self._convict(fate, key, what)
            raise fate.poison(f"it was on two engines that stopped answering, the last its {role} engine, "
                              f"for {timeout:g}s", f"on parole, {what}")
        if not self.cfg.parole_suspects or fate.paroled:
            metrics.POISON_SUSPECTS.labels(fate.model, "refused").inc()
            raise fate.poison(f"its {role} engine gave no sign of life for {timeout:g}s while serving it", what)
        ticket = self.quarantine.join((key, self.scheduler.liveness.episode(key)))
        try:
            if self.quarantine.turn(ticket) is Turn.WAIT:
                fut = self._turns[ticket] = asyncio.get_running_loop().create_future()
                try:
                    # its turn comes when the member on parole is answered (a first byte) or
                    # convicted (a stall): within about one first-byte deadline
                    async with asyncio.timeout(timeout):
                        await fut
                except TimeoutError:
                    metrics.POISON_SUSPECTS.labels(fate.model, "refused").inc()
                    raise fate.poison(f"its {role} engine gave no sign of life for {timeout:g}s while serving it, "
                                      "and the check of the other requests it was serving took too long",
                                      f"{what}; no parole within {timeout:g}s") from None
                finally:
                    self._turns.pop(ticket, None)
        except BaseException:
            self._wake(self.quarantine.leave(ticket))
            raise
        if self.quarantine.turn(ticket) is Turn.FREE:
            metrics.POISON_SUSPECTS.labels(fate.model, "exonerated").inc()
            self._wake(self.quarantine.leave(ticket))
            log.warning("%s; request %s was its victim (another request on it was convicted): retrying it "
                        "on another engine", what, fate.rid)
            return
        fate.parole, fate.parole_role, fate.paroled = ticket, role, True
        metrics.POISON_SUSPECTS.labels(fate.model, "paroled").inc()
        log.warning("%s; request %s may be what hung it: sending it to another engine on parole (it is "
                    "refused if that one stops answering too)", what, fate.rid)

    def _convict(self, fate: _Fate, key: Key, what: str) -> None:
        """*fate*'s request, on parole, hung engine *key* too: it is the poison. The hangs of both
        engines are explained: the other requests on them were its victims."""
        assert fate.parole is not None
        live = self.scheduler.liveness
        metrics.POISON_SUSPECTS.labels(fate.model, "convicted").inc()
        origin = self.quarantine.group_of(fate.parole)
        if origin is not None and live.episode(origin[0]) == origin[1]:
            live.explain(origin[0])  # still silent since it hung under this request
        woken = self.quarantine.convicted(fate.parole)
        woken += self.quarantine.explain((key, live.episode(key)))
        live.explain(key)
        fate.parole = None
        self._wake(woken)
        log.error("request %s convicted as poison: %s", fate.rid, what)

    def _wake(self, tickets: list[int]) -> None:
        for t in tickets:
            fut = self._turns.get(t)
            if fut is not None and not fut.done():
                fut.set_result(None)

    def _handoff_exhausted(self, req: ParsedRequest, p: Candidate, d: Candidate, retries: int,
                           answer: bytes) -> Unavailable:
        """The decode could not load the prefill's KV, *retries* hand-off retries included: the
        engine's error (vLLM: an ``InternalServerError`` object) goes to the log, the client gets
        a retryable error that names no engine."""
        rid = request_id_var.get()
        log.warning("KV hand-off failed %d time(s) for model %r (request id %s), last prefill %s -> decode %s: %s",
                    retries + 1, req.model, rid, p.endpoint.host_port, d.endpoint.host_port,
                    answer[:ENGINE_ERROR_LOG_BYTES].decode("utf-8", "replace"))
        return Unavailable(
            f"the decode engine could not load the prefill's KV cache ({retries + 1} attempt(s)) for model "
            f"{req.model!r}; retry later (the coordinator log has the details under request id {rid})",
            reason="KV_TRANSFER_FAILED",
            metadata={"model": req.model},
        )

    async def _relay(
        self, resp: EngineResponse, cand: Candidate, head: Head, *, count_5xx: bool = True,
        read: Sequence[bytes] | None = None, call: EngineCall | None = None,
    ) -> AsyncIterator[Frame]:
        """Yield *head* then the body (*read*: what was already read of it, see :meth:`_peek`). A
        decode's 5xx is often its prefill's fault (lost KV), so only union answers count 5xx
        against the endpoint's breaker."""
        if resp.status >= 500 and count_5xx:
            self.scheduler.record_failure(cand.endpoint)
        else:
            self.scheduler.record_success(cand.endpoint)
        if call is not None:
            call.head(resp.status)
        if resp.status >= 500:
            # An engine's 5xx body is its internals (vLLM's carries the exception class, a traceback
            # may name hosts): the client gets a public error object, the log the engine's words.
            yield Head(head.http_status, JSON, head.request_id, head.prefill_instance_id, head.decode_instance_id)
            yield await self._public_5xx(resp, cand, head, read)
            if call is not None:
                call.end()
            return
        yield head
        try:
            for chunk in read or ():
                if call is not None:
                    call.first_byte()
                yield chunk
            if head.content_type.startswith(SSE):
                async for chunk in self._chunks(resp, endpoint_key(cand.endpoint)):
                    if call is not None:
                        call.first_byte()
                    yield chunk
            elif read is None:  # a complete answer: read as one message, sent as one chunk
                data = await read_body(resp)
                if call is not None:
                    call.first_byte()
                yield data
            if call is not None:
                call.end()
        except AnswerTooLarge as exc:
            if call is not None:
                call.fail("answer_too_large")
            raise self._too_large(cand.endpoint.host_port, exc) from exc
        except (aiohttp.ClientError, OSError) as exc:
            if call is not None:
                call.fail("stream_broken")
            self.scheduler.trip(cand.endpoint)  # it died mid-answer: no new work until a probe passes
            rid = request_id_var.get()
            log.warning("engine %s broke the response stream (request id %s): %r", cand.endpoint.host_port, rid, exc)
            raise Unavailable(
                f"the engine broke the response stream; the coordinator log has the details under request id {rid}",
                reason="ENGINE_STREAM_BROKEN",
            ) from exc
        except _Stalled:
            if call is not None:
                call.fail("stream_stalled")
            self.scheduler.trip(cand.endpoint)  # hung mid-answer: no new work until a probe passes
            metrics.STREAM_STALLS.inc()
            rid = request_id_var.get()
            limit = self.cfg.inter_token_timeout_sec
            log.warning("engine %s stopped streaming: no chunk and no sign of life for %gs (request id %s)",
                        cand.endpoint.host_port, limit, rid)
            raise Unavailable(
                f"the engine stopped sending the answer (no sign of life for {limit:g}s); the coordinator "
                f"log has the details under request id {rid}",
                reason="ENGINE_STREAM_BROKEN",
            ) from None

    @staticmethod
    def _too_large(engine: str, exc: AnswerTooLarge) -> FailedPrecondition:
        """A non-streamed answer the coordinator will not hold whole: the engine is not at fault
        (not tripped) and another engine would answer the same (not retried or continued)."""
        rid = request_id_var.get()
        log.warning("engine %s: %s (request id %s); the request fails", engine, exc, rid)
        return FailedPrecondition(
            f"the answer to request {rid} is larger than {engine_client.MAX_ANSWER_BYTES // 2**20} MiB, more than "
            "Motor relays as one non-streamed answer; send it with \"stream\": true or ask for fewer tokens",
            reason="RESPONSE_TOO_LARGE",
        )

    async def _chunks(self, resp: EngineResponse, key: Key, limit: float | None = None) -> AsyncIterator[bytes]:
        """The SSE body's chunks as they come; raise :class:`_Stalled` once the engine has given no
        sign of life (no chunk of this stream, no answer to anything else, no probe or scrape) for
        *limit* (default ``inter_token_timeout_sec``) since the last chunk. An engine that answers
        its probes is alive and waited for; with probes off nothing tells slow from hung, so
        nothing stalls."""
        live = self.scheduler.liveness
        watch = self.cfg.health_probe_interval_sec > 0
        limit = self.cfg.inter_token_timeout_sec if limit is None else limit
        content = resp.content
        while True:
            if not watch:
                chunk = await content.readany()
            else:
                since = live.sent(key)  # waiting for the next chunk from now on
                while True:
                    left = limit - live.silent_for(since)
                    if left <= 0:
                        raise _Stalled()
                    # readany() loses nothing when cancelled (bytes stay in the reader's buffer)
                    cm = asyncio.timeout(left)
                    try:
                        async with cm:
                            chunk = await content.readany()
                        break
                    except TimeoutError:
                        if not cm.expired():
                            raise
            if not chunk:
                return
            live.alive(key)
            yield chunk

    async def _public_5xx(self, resp: EngineResponse, cand: Candidate, head: Head,
                          read: Sequence[bytes] | None) -> bytes:
        """Log an engine's 5xx answer (its first ``ENGINE_ERROR_LOG_BYTES``) with the request id and
        return the public body the client gets instead."""
        got = b"".join(read or ())
        complete = read is not None and not head.content_type.startswith(SSE)  # _peek read all of it
        try:
            while not complete and len(got) < ENGINE_ERROR_LOG_BYTES:
                chunk = await resp.content.read(ENGINE_ERROR_LOG_BYTES - len(got))
                if not chunk:
                    break
                got += chunk
        except (aiohttp.ClientError, OSError) as exc:
            got += f" [body cut off: {exc!r}]".encode()
        log.warning("engine %s answered HTTP %d (request id %s); the client gets a public error instead: %s",
                    cand.endpoint.host_port, head.http_status, head.request_id,
                    got[:ENGINE_ERROR_LOG_BYTES].decode("utf-8", "replace"))
        return public_engine_error(head.http_status, head.request_id)

    async def _peek(self, resp: EngineResponse, adapter: EngineAdapter, key: Key) -> tuple[bool, list[bytes]]:
        """Read a decode's answer until its adapter can tell whether the KV hand-off failed (a JSON
        answer: all of it; a stream: its first decisive event). Returns (failed, bytes read).

        A stream's head comes before its first token (vLLM sends the headers at once), so the
        first-byte watchdog saw the engine answer; until the first decisive event the engine is
        watched here, under the same ``first_byte_timeout_sec`` of no sign of life: raises
        :class:`_Stalled` (an engine frozen after its head held the request for ever)."""
        ctype = resp.headers.get("Content-Type", JSON)
        read: list[bytes] = []
        try:
            if not ctype.startswith(SSE):
                read.append(await read_body(resp))
                return adapter.handoff_failed(resp.status, ctype, read[0]) is True, read
            head = b""
            async for chunk in self._chunks(resp, key, self.cfg.first_byte_timeout_sec):
                read.append(chunk)
                head += chunk
                verdict = adapter.handoff_failed(resp.status, ctype, head)
                if verdict is not None:
                    return verdict is True, read
            return adapter.handoff_failed(resp.status, ctype, head) is True, read  # the stream ended
        except AnswerTooLarge as exc:
            raise self._too_large(resp.host_port, exc) from exc
        except (aiohttp.ClientError, OSError) as exc:
            rid = request_id_var.get()
            log.warning("engine %s broke its answer before the first byte (request id %s): %r",
                        resp.host_port, rid, exc)
            raise Unavailable(
                "the engine broke off its answer before the first byte; the coordinator log has the details "
                f"under request id {rid}",
                reason="ENGINE_STREAM_BROKEN",
            ) from exc

    async def _prefill(
        self, cand: Candidate, req: ParsedRequest, body: dict[str, Any], rid: str, fate: _Fate, tokens: int = 0,
    ) -> _Answer:
        """Run a prefill; raise _PrefillFailed for retryable failures (unreachable, 5xx, junk).
        *tokens*: the prompt tokens it is expected to compute (queued on *cand* meanwhile)."""
        call = fate.trace.call("prefill", cand)
        async with self.scheduler.load_guard(cand, tokens=tokens):
            try:
                status, ctype, data = await self._attempt(
                    cand, "prefill", fate, self.client.read_all(cand.endpoint, req.path, body, rid, trace=call.carrier))
            except EngineUnreachable as exc:
                call.fail("unreachable")
                self.scheduler.record_failure(cand.endpoint)
                raise _PrefillFailed(str(exc), "unreachable", answered=exc.headed) from exc
        call.answered(status)
        if status >= 500:
            self.scheduler.record_failure(cand.endpoint)
            raise _PrefillFailed(f"engine {cand.endpoint.host_port} answered HTTP {status}", "engine_error")
        self.scheduler.record_success(cand.endpoint)
        return _Answer(status, ctype, data)

    # -- union ------------------------------------------------------------------------------

    async def _union(
        self, req: ParsedRequest, first: Candidate, info: RequestInfo, rid: str, fate: _Fate,
        role: Role = Role.UNION,
    ) -> AsyncIterator[Frame]:
        """The request whole to one endpoint of *role* (a union instance, or a vLLM decode or prefill
        while no instance of the other role is schedulable), another one after an unreachable engine."""
        cand: Candidate | None = first
        tried: list[EndpointKey] = []
        last = ""
        name = role.value
        while cand is not None and len(tried) <= self.cfg.prefill_retries:
            call = fate.trace.call(name, cand)
            async with self.scheduler.load_guard(cand):
                try:
                    resp = await self._attempt(
                        cand, name, fate,
                        self.client.open(cand.endpoint, req.path, dict(req.body), rid, trace=call.carrier))
                except EngineUnreachable as exc:
                    call.fail("unreachable")
                    self.scheduler.record_failure(cand.endpoint)
                    last = str(exc)
                else:
                    async for frame in self._relay_whole(resp, cand, rid, call):
                        yield frame
                    return
            tried.append(endpoint_key(cand.endpoint))
            failed, cand = cand, self.scheduler.pick(role, info, engine=cand.instance.engine_type, exclude=tried)
            if len(tried) <= self.cfg.prefill_retries:
                fate.trace.retry(name, "unreachable", failed, cand)
        raise self._exhausted(name, req, len(tried), last or f"no other {name} endpoint")

    async def _open_whole(self, cand: Candidate, req: ParsedRequest, rid: str,
                          fate: _Fate) -> tuple[EngineResponse | None, EngineCall, str]:
        """Send the request as it is to *cand*'s engine (a pass-through or stored-response attempt)
        under the first-byte watchdog: its response, or None and why it could not be reached (the
        engine's failure recorded)."""
        call = fate.trace.call(cand.instance.role.value, cand)
        try:
            resp = await self._attempt(cand, cand.instance.role.value, fate, self.client.open(
                cand.endpoint, req.path, req.engine_body, rid, trace=call.carrier, method=req.method))
        except EngineUnreachable as exc:
            call.fail("unreachable")
            self.scheduler.record_failure(cand.endpoint)
            return None, call, str(exc)
        return resp, call, ""

    async def _relay_whole(self, resp: EngineResponse, cand: Candidate, rid: str,
                           call: EngineCall) -> AsyncIterator[Frame]:
        """One engine's answer relayed as it is (a union or pass-through attempt): its head, then
        its body; the response closed on any failure and released at the end."""
        head = Head(resp.status, resp.headers.get("Content-Type", JSON), rid, cand.instance.id, cand.instance.id)
        try:
            async for frame in self._relay(resp, cand, head, call=call):
                yield frame
        except BaseException:
            resp.close()
            raise
        finally:
            resp.release()

    # -- pass-through APIs (passthrough.py) ---------------------------------------------------

    def _passthrough_model(self, req: ParsedRequest) -> str:
        models = self.scheduler.models()
        if req.api == VERSION:  # any model: the first with a schedulable instance
            for model in sorted(models):
                info = RequestInfo(0, model, "")
                if self.scheduler.pick_first(passthrough.roles(req.api), info, count=False) is not None:
                    return model
            raise Unavailable("no schedulable instance to answer /version", reason="NO_SCHEDULABLE_INSTANCE")
        model = passthrough.resolve_model(req.model, models)
        if model not in models:
            raise NotFound(f"model {model!r} is not served by any registered instance", reason="MODEL_NOT_FOUND",
                           metadata={"model": model, "param": "model"})
        return model

    async def _passthrough(self, req: ParsedRequest, rid: str, fate: _Fate) -> AsyncGenerator[Frame, None]:
        """The request relayed whole to one instance of the roles ``passthrough.roles`` allows,
        another one after an unreachable engine (at most ``prefill_retries`` times). A request for
        a stored response goes where it is (:meth:`_stored`)."""
        if req.response_id is not None:
            async for frame in self._stored(req, req.response_id, rid, fate):
                yield frame
            return
        model = self._passthrough_model(req)
        info = RequestInfo(next(self._seq), model, prompt_prefix(req, self.prefix_chars))
        order = passthrough.roles(req.api)
        tried: list[EndpointKey] = []
        last = ""
        while len(tried) <= self.cfg.prefill_retries:
            cand = self.scheduler.pick_first(order, info, tried)
            if cand is None:
                break
            async with self.scheduler.load_guard(cand):
                resp, call, failure = await self._open_whole(cand, req, rid, fate)
                if resp is None:
                    last = failure
                else:
                    # a 5xx counts against the engine: nothing else took part in the answer
                    async for frame in self._remembering(req, cand, self._relay_whole(resp, cand, rid, call)):
                        yield frame
                    return
            tried.append(endpoint_key(cand.endpoint))
        if not tried:
            names = " or ".join(r.value for r in order)
            raise Unavailable(f"no schedulable {names} instance of model {model!r} for {req.path}",
                              reason="NO_SCHEDULABLE_INSTANCE", metadata={"model": model, "role": names})
        raise self._exhausted("engine", replace(req, model=model), len(tried), last or "no other instance")

    # -- stored responses (response_homes.py) ------------------------------------------------

    async def _remembering(self, req: ParsedRequest, cand: Candidate,
                           frames: AsyncIterator[Frame]) -> AsyncIterator[Frame]:
        """*frames* relayed; the id of a /v1/responses answer that may be stored (``store`` not
        false) remembered as living on *cand*'s endpoint."""
        if req.api != RESPONSES or req.body.get("store") is False:
            async for frame in frames:
                yield frame
            return
        ctype, seen, found = "", bytearray(), False
        limit = MAX_JSON_BYTES
        async for frame in frames:
            yield frame
            if isinstance(frame, Head):
                ctype = frame.content_type
                found = frame.http_status != 200  # nothing to remember
                limit = MAX_FIRST_EVENT_BYTES if ctype.startswith(SSE) else MAX_JSON_BYTES
                continue
            if found:
                continue
            seen += frame
            if len(seen) > limit:
                found = True
            elif ctype.startswith(SSE) and b"\n\n" in seen:
                found = True
                self._remember(response_id_of(ctype, bytes(seen)), cand)
        if not found and seen:
            self._remember(response_id_of(ctype, bytes(seen)), cand)

    def _remember(self, response_id: str | None, cand: Candidate) -> None:
        if response_id is not None:
            self.response_homes.remember(response_id, endpoint_key(cand.endpoint))

    async def _stored(self, req: ParsedRequest, response_id: str, rid: str, fate: _Fate) -> AsyncIterator[Frame]:
        """A request that must reach the engine holding *response_id* (retrieve, cancel, or a new
        response continuing it): the remembered endpoint first, then the other union/decode
        endpoints (of the request's model, if it names one) in turn, at most ``MAX_PROBES``; the
        first answer that is not a 404 is relayed, else the last engine's own 404."""
        model = self._passthrough_model(req) if req.api == RESPONSES else None
        holders = self.scheduler.holders(passthrough.roles(req.api), model)
        keys = [endpoint_key(c.endpoint) for c in holders]
        order = probe_order(holders, keys, self.response_homes.home(response_id))
        if not order:
            where = f" of model {model!r}" if model else ""
            raise Unavailable(f"no schedulable union or decode instance{where} to look for response {response_id!r} on",
                              reason="NO_SCHEDULABLE_INSTANCE", metadata={"role": "union or decode"})
        last: _Answer | None = None
        unreachable = ""
        for cand in order:
            async with self.scheduler.load_guard(cand):
                resp, call, failure = await self._open_whole(cand, req, rid, fate)
                if resp is None:
                    unreachable = failure
                    continue
                if resp.status == 404:  # not stored here (or no such route on this engine)
                    try:
                        data = await read_body(resp)
                    except (aiohttp.ClientError, OSError):
                        data = b""
                    finally:
                        resp.release()
                    call.head(404)
                    call.end()
                    self.scheduler.record_success(cand.endpoint)
                    last = _Answer(404, resp.headers.get("Content-Type", JSON), data)
                    continue
                if resp.status == 200:
                    self.response_homes.remember(response_id, endpoint_key(cand.endpoint))
                async for frame in self._remembering(req, cand, self._relay_whole(resp, cand, rid, call)):
                    yield frame
                return
        if last is None:
            raise self._exhausted("engine", replace(req, model=model or ""), len(order), unreachable)
        if b'"error"' in last.body:  # the engine's own 404 (vLLM's shape)
            yield Head(404, last.content_type, rid)
            yield last.body
            return
        yield Head(404, JSON, rid)  # e.g. an engine without the route ({"detail": "Not Found"}): vLLM's words
        yield orjson.dumps({"error": {"message": f"Response with id '{response_id}' not found.",
                                      "type": "invalid_request_error", "param": "response_id", "code": 404}})

    # -- prefill, then decode (vLLM) ---------------------------------------------------------

    async def _prefill_with_retries(
        self, adapter: EngineAdapter, req: ParsedRequest, route: Route, info: RequestInfo, rid: str,
        p: Candidate, fate: _Fate, *, alone_ok: bool = False,
    ) -> tuple[Candidate, dict[str, Any], dict[str, Any] | _Answer]:
        """Run the prefill, on other prefills after retryable failures. Returns the prefill that
        answered, the body it was sent and its parsed reply — or its refusal (an _Answer to relay).
        With *alone_ok*, raises _DecodeAlone when every prefill tried was unreachable."""
        tried: list[EndpointKey] = []
        unreachable = True  # every failure so far: the engine sent no answer at all
        while True:
            pbody = adapter.prefill_body(req.body, p.endpoint)
            try:
                answer = await self._prefill(p, req, pbody, rid, fate, route.prefill_tokens)
            except _PrefillFailed as exc:
                tried.append(endpoint_key(p.endpoint))
                unreachable = unreachable and not exc.answered
                nxt = self._next(Role.PREFILL, info, route, tried)
                if nxt is None or len(tried) > self.cfg.prefill_retries:
                    if alone_ok and unreachable and self.scheduler.decode_only_fallback:
                        raise _DecodeAlone(f"prefill unreachable on {len(tried)} endpoint(s): {exc}") from None
                    raise self._exhausted("prefill", req, len(tried), str(exc)) from None
                fate.trace.retry("prefill", exc.reason, p, nxt)
                p = nxt
                continue
            if answer.status != 200:  # the engine refused the request: relay its error unchanged
                return p, pbody, answer
            try:
                parsed = orjson.loads(answer.body)
            except orjson.JSONDecodeError:
                parsed = None
            if not isinstance(parsed, dict):
                log.warning("prefill %s answered HTTP 200 with a body that is not a JSON object (request id %s): "
                            "no KV hand-off, the decode computes the prompt itself", p.endpoint.host_port, rid)
                parsed = {}
            return p, pbody, parsed

    async def _sequential(
        self, req: ParsedRequest, route: Route, info: RequestInfo, rid: str, fate: _Fate
    ) -> AsyncIterator[Frame]:
        adapter = self.adapters[route.engine]
        p, d = route.prefill, route.decode
        assert p is not None and d is not None
        try:
            p, pbody, reply = await self._prefill_with_retries(adapter, req, route, info, rid, p, fate,
                                                               alone_ok=route.engine is EngineType.VLLM)
        except _DecodeAlone as exc:
            self.scheduler.decided(Role.DECODE, "decode_only")
            log.warning("request %s: %s; the decode computes it whole", rid, exc)
            async for frame in self._union(req, d, info, rid, fate, Role.DECODE):
                yield frame
            return
        if isinstance(reply, _Answer):
            yield Head(reply.status, reply.content_type, rid, p.instance.id, d.instance.id)
            yield reply.body
            return
        # The decode body names the prefill (kv_transfer_params), not the decode: an unreachable
        # decode is retried on another one with the same body, until a head was yielded.
        dbody = adapter.decode_body(req.body, pbody, reply)
        tried_d: list[EndpointKey] = []
        dcand: Candidate | None = d
        last = ""
        kv_retries = 0
        while dcand is not None and len(tried_d) <= self.cfg.decode_retries:
            d = dcand
            handoff_failed = False
            call = fate.trace.call("decode", d)
            async with self.scheduler.load_guard(d):
                try:
                    resp = await self._attempt(
                        d, "decode", fate, self.client.open(d.endpoint, req.path, dbody, rid, trace=call.carrier))
                except EngineUnreachable as exc:
                    call.fail("unreachable")
                    self.scheduler.record_failure(d.endpoint)
                    last = str(exc)
                else:
                    head = Head(resp.status, resp.headers.get("Content-Type", JSON), rid, p.instance.id, d.instance.id)
                    try:
                        handoff_failed, read = await self._peek(resp, adapter, endpoint_key(d.endpoint))
                        if not handoff_failed:
                            async for frame in self._relay(resp, d, head, count_5xx=False, read=read, call=call):
                                yield frame
                            return
                        call.fail("kv_handoff_failed")
                        if kv_retries >= self.cfg.kv_load_retries:
                            raise self._handoff_exhausted(req, p, d, kv_retries, b"".join(read))
                    except _Stalled:  # its head came, then nothing: like a decode that never answered
                        resp.close()
                        call.fail("stalled")
                        self.scheduler.trip(d.endpoint)
                        metrics.ENGINE_STALLS.labels("decode").inc()
                        last = (f"decode {d.endpoint.host_port} sent its head, then no token and no sign of life "
                                f"for {self.cfg.first_byte_timeout_sec:g}s")
                        log.warning("request %s: %s; retrying on another decode", rid, last)
                        fate.drops += 1
                        if fate.drops >= 2:
                            raise fate.poison(f"{fate.drops} engines stopped answering while serving it",
                                              f"{fate.drops} engines went silent under it, the last "
                                              f"{d.endpoint.host_port}") from None  # fmt: skip
                    except BaseException:
                        resp.close()
                        raise
                    finally:
                        resp.release()
            if handoff_failed:  # run the hand-off again: fresh KV, another decode if there is one
                kv_retries += 1
                failed_d, failed_p = d, p
                dcand = self._next(Role.DECODE, info, route, [*tried_d, endpoint_key(d.endpoint)]) or d
                # either side of the hand-off may be at fault (a frozen prefill cannot serve its KV):
                # another prefill too, when one is schedulable
                p = self._next(Role.PREFILL, info, route, [endpoint_key(p.endpoint)]) or p
                fate.trace.retry("decode", "kv_handoff_failed", failed_d, dcand)
                log.warning(
                    "decode %s could not load the KV of prefill %s (request %s); hand-off retry %d/%d on prefill "
                    "%s, decode %s", failed_d.endpoint.host_port, failed_p.endpoint.host_port, rid, kv_retries,
                    self.cfg.kv_load_retries, p.endpoint.host_port, dcand.endpoint.host_port,
                )
                try:
                    p, pbody, reply = await self._prefill_with_retries(adapter, req, route, info, rid, p, fate,
                                                                       alone_ok=route.engine is EngineType.VLLM)
                except _DecodeAlone as exc:  # e.g. the only prefill died after its first answer
                    self.scheduler.decided(Role.DECODE, "decode_only")
                    log.warning("request %s: hand-off retry: %s; decode %s computes it whole", rid, exc,
                                dcand.endpoint.host_port)
                    async for frame in self._union(req, dcand, info, rid, fate, Role.DECODE):
                        yield frame
                    return
                if isinstance(reply, _Answer):
                    yield Head(reply.status, reply.content_type, rid, p.instance.id, dcand.instance.id)
                    yield reply.body
                    return
                dbody = adapter.decode_body(req.body, pbody, reply)
                continue
            tried_d.append(endpoint_key(d.endpoint))
            dcand = self._next(Role.DECODE, info, route, tried_d)
            if len(tried_d) <= self.cfg.decode_retries:
                fate.trace.retry("decode", "unreachable", d, dcand)
        if route.engine is EngineType.VLLM and self.scheduler.prefill_only_fallback:
            # no decode took it (none sent a head): the prefill that just answered computes it
            # whole, its prompt a prefix-cache hit there
            self.scheduler.decided(Role.PREFILL, "prefill_only")
            log.warning("request %s: decode unreachable on %d endpoint(s) (%s); prefill %s computes it whole",
                        rid, len(tried_d), last or "no other decode endpoint", p.endpoint.host_port)
            async for frame in self._union(req, p, info, rid, fate, Role.PREFILL):
                yield frame
            return
        raise self._exhausted("decode", req, len(tried_d), last)

    # -- both at once (SGLang) ---------------------------------------------------------------

    async def _concurrent(
        self, req: ParsedRequest, route: Route, info: RequestInfo, rid: str, fate: _Fate
    ) -> AsyncIterator[Frame]:
        """The bootstrap room ties the pair together: a failed prefill retries with the next
        prefill, an unreachable decode with the next decode (same prefill); either way the whole
        pair is sent again with fresh bodies, hence a fresh room."""
        adapter = self.adapters[route.engine]
        p, d = route.prefill, route.decode
        assert p is not None and d is not None
        tried: list[EndpointKey] = []
        tried_d: list[EndpointKey] = []
        while True:
            pbody = adapter.prefill_body(req.body, p.endpoint)
            dbody = adapter.decode_body(req.body, pbody, None)
            failure: str | None = None
            reason: RetryReason = "unreachable"
            d_failure: str | None = None
            async with self.scheduler.load_guard(d):  # the prefill counts itself while it runs (_prefill)
                p_task = asyncio.ensure_future(self._prefill(p, req, pbody, rid, fate, route.prefill_tokens))
                call = fate.trace.call("decode", d)
                d_task = asyncio.ensure_future(self._attempt(
                    d, "decode", fate, self.client.open(d.endpoint, req.path, dbody, rid, trace=call.carrier)))
                resp: EngineResponse | None = None
                try:
                    await asyncio.wait({p_task, d_task}, return_when=asyncio.FIRST_COMPLETED)
                    if not d_task.done() and p_task.done():
                        exc = p_task.exception()
                        if isinstance(exc, _PrefillFailed):
                            failure, reason = str(exc), exc.reason
                        elif exc is not None:
                            raise exc
                        elif p_task.result().status != 200:  # prefill refused: relay its error
                            answer = p_task.result()
                            yield Head(answer.status, answer.content_type, rid, p.instance.id, d.instance.id)
                            yield answer.body
                            return
                        else:
                            await asyncio.wait({d_task})
                    if failure is None:
                        try:
                            resp = await d_task
                        except EngineUnreachable as exc:  # no byte reached the client yet
                            call.fail("unreachable")
                            self.scheduler.record_failure(d.endpoint)
                            d_failure = str(exc)
                    if failure is None and d_failure is None:
                        assert resp is not None
                        if resp.status >= 500:  # was it the prefill's fault? then retry elsewhere
                            await asyncio.wait({p_task}, timeout=self.cfg.connect_timeout_sec)
                            p_exc = p_task.exception() if p_task.done() else None
                            if isinstance(p_exc, _PrefillFailed):
                                failure, reason = str(p_exc), p_exc.reason
                    if failure is None and d_failure is None:
                        assert resp is not None
                        head = Head(resp.status, resp.headers.get("Content-Type", JSON), rid,
                                    p.instance.id, d.instance.id)
                        async for frame in self._relay(resp, d, head, count_5xx=False, call=call):
                            yield frame
                        if not p_task.done():
                            await asyncio.wait({p_task}, timeout=self.cfg.connect_timeout_sec)
                        return
                except BaseException:
                    if resp is not None:
                        resp.close()
                    raise
                finally:
                    if resp is not None:
                        resp.release()
                    for t in (p_task, d_task):
                        t.cancel()
                    await asyncio.gather(p_task, d_task, return_exceptions=True)
                    if d_task.done() and not d_task.cancelled() and d_task.exception() is None:
                        unused = d_task.result()
                        if unused is not resp:
                            unused.close()
            if failure is not None:
                call.fail("prefill failed")
            if d_failure is not None:
                tried_d.append(endpoint_key(d.endpoint))
                nxt = self._next(Role.DECODE, info, route, tried_d)
                if nxt is None or len(tried_d) > self.cfg.decode_retries:
                    raise self._exhausted("decode", req, len(tried_d), d_failure)
                fate.trace.retry("decode", "unreachable", d, nxt)
                d = nxt
                continue
            tried.append(endpoint_key(p.endpoint))
            nxt = self._next(Role.PREFILL, info, route, tried)
            if nxt is None or len(tried) > self.cfg.prefill_retries:
                raise self._exhausted("prefill", req, len(tried), failure or "")
            fate.trace.retry("prefill", reason, p, nxt)
            p = nxt
