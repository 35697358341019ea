"""``motor.coordinator.v1.DispatchService`` (no management key): Dispatch, DispatchMany (many Dispatch
calls on one stream, ``dispatch_mux``), ListModels, GetReadiness."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from motor_common.convert import ROLE_TO_PB as INSTANCE_ROLE_TO_PB
from motor_common.convert import model_card_to_pb
from motor_common.domain import InstanceStatus, Role
from motor_common.errors import DeadlineExceeded, InvalidArgument, Unavailable
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2 as cpb
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2_grpc as cgrpc
from motor_common.grpc_server import printable_id
from motor_common.logs import new_request_id, request_id_var
from motor_common.tracing import Carrier, carrier_from
from motor_coordinator.dispatch_mux import Gate, serve_stream
from motor_coordinator.dispatcher import Head
from motor_coordinator.leadership import LeaderRole, Leadership
from motor_coordinator.readiness import DEGRADED_HEADER, NOT_SYNCED, admission
from motor_coordinator.registry import RegistryState
from motor_coordinator.request import (
    CHAT,
    COMPLETIONS,
    DETOKENIZE,
    EMBEDDINGS,
    RESPONSES,
    RESPONSES_CANCEL,
    RESPONSES_RETRIEVE,
    TOKENIZE,
    VERSION,
    parse_body,
)
from motor_coordinator.request_metrics import observed

if TYPE_CHECKING:
    from motor_coordinator.app import Coordinator

SERVICE_NAME = "motor.coordinator.v1.DispatchService"

_APIS = {cpb.OPEN_AI_API_COMPLETIONS: COMPLETIONS, cpb.OPEN_AI_API_CHAT_COMPLETIONS: CHAT,
         cpb.OPEN_AI_API_EMBEDDINGS: EMBEDDINGS, cpb.OPEN_AI_API_RESPONSES: RESPONSES,
         cpb.OPEN_AI_API_TOKENIZE: TOKENIZE, cpb.OPEN_AI_API_DETOKENIZE: DETOKENIZE,
         cpb.OPEN_AI_API_VERSION: VERSION, cpb.OPEN_AI_API_RESPONSES_RETRIEVE: RESPONSES_RETRIEVE,
         cpb.OPEN_AI_API_RESPONSES_CANCEL: RESPONSES_CANCEL}
ROLE_TO_PB = {
    LeaderRole.STANDALONE: cpb.COORDINATOR_ROLE_STANDALONE,
    LeaderRole.MASTER: cpb.COORDINATOR_ROLE_MASTER,
    LeaderRole.STANDBY: cpb.COORDINATOR_ROLE_STANDBY,
}


class DispatchServicer(cgrpc.DispatchServiceServicer):
    def __init__(self, app: Coordinator) -> None:
        self.app = app

    async def Dispatch(self, request: cpb.DispatchRequest, context: Any) -> AsyncIterator[cpb.DispatchResponse]:
        metadata = context.invocation_metadata() or ()
        async for frame in self.frames(request, _degraded_hint(metadata), context.time_remaining(),
                                       carrier_from(metadata)):  # traceparent from the gateway
            yield frame

    def DispatchMany(self, requests: AsyncIterator[cpb.DispatchManyRequest], context: Any
                     ) -> AsyncIterator[cpb.DispatchManyResponse]:
        return serve_stream(requests, self.frames)

    async def frames(self, request: cpb.DispatchRequest, degraded: bool, remaining: float | None,
                     trace: Carrier, gate: Gate | None = None) -> AsyncIterator[cpb.DispatchResponse]:
        """One Dispatch: its response frames; raises ``MotorError``. *remaining*: the caller's
        deadline in seconds (None = none); the configured request timeout bounds it. *trace*: the
        caller's trace context. *gate*: awaited before each frame goes out (DispatchMany's flow
        control: it waits while the request's window is used up, within the deadline)."""
        api = _APIS.get(request.api)
        if api is None:
            raise InvalidArgument(
                "api must be set: one of " + ", ".join(cpb.OpenAiApi.Name(a) for a in _APIS), reason="INVALID_API"
            )
        if request.request_id and not printable_id(request.request_id):
            raise InvalidArgument("request_id must be printable ASCII (no control characters): it goes into "
                                  "log lines and the engines' X-Request-Id header", reason="INVALID_REQUEST_ID",
                                  metadata={"field": "request_id"})
        admit(self.app, degraded_hint=degraded)
        parsed = parse_body(api, request.body)
        rid = request.request_id or request_id_var.get() or new_request_id()
        # The id the client knows is the one every message and log line of this request names.
        request_id_var.set(rid)
        timeout = self.app.cfg.dispatch.request_timeout_sec
        if remaining is not None:
            timeout = min(timeout, remaining)
        try:
            async with asyncio.timeout(timeout):
                async for frame in observed(self.app.dispatcher.dispatch(parsed, rid, trace=trace), parsed.model):
                    if isinstance(frame, Head):
                        msg = cpb.DispatchResponse(head=cpb.ResponseHead(
                            http_status=frame.http_status,
                            content_type=frame.content_type,
                            request_id=frame.request_id,
                            prefill_instance_id=frame.prefill_instance_id,
                            decode_instance_id=frame.decode_instance_id,
                        ))
                    else:
                        msg = cpb.DispatchResponse(chunk=frame)
                    if gate is not None:
                        await gate(msg)
                    yield msg
        except TimeoutError:
            raise DeadlineExceeded(
                f"request {rid} did not finish within {timeout:.3g}s", reason="REQUEST_TIMEOUT"
            ) from None

    async def ListModels(self, request: cpb.ListModelsRequest, context: Any) -> cpb.ListModelsResponse:
        models = []
        for name, insts in sorted(self.app.scheduler.models().items()):
            model = cpb.Model(
                id=name,
                created=self.app.model_created(name),
                prefill_instances=sum(i.role is Role.PREFILL for i in insts),
                decode_instances=sum(i.role is Role.DECODE for i in insts),
                union_instances=sum(i.role is Role.UNION for i in insts),
            )
            card = self.app.monitor.cards.get(name)
            if card is not None:
                model_card_to_pb(card, model)
            models.append(model)
        return cpb.ListModelsResponse(models=models)

    async def GetReadiness(self, request: cpb.GetReadinessRequest, context: Any) -> cpb.GetReadinessResponse:
        r = self.app.readiness()
        lead = self.app.leadership
        return cpb.GetReadinessResponse(
            ready=r.ready,
            reason=r.reason,
            role=ROLE_TO_PB[lead.role],
            isolated=lead.isolated,
            generation=self.app.state.generation,
            store_available=lead.store_available,
            available_instances=sum(i.status is InstanceStatus.AVAILABLE for i in self.app.observed_instances()),
            advertise_address=self.app.address,
            served_alone=[cpb.ServedAlone(model=m, role=INSTANCE_ROLE_TO_PB[role])
                          for m, role in sorted(self.app.scheduler.served_alone().items())],
        )


class Admitting(Protocol):
    """What :func:`admit` reads: who this process is (leadership) and whether it knows the fleet."""

    @property
    def leadership(self) -> Leadership: ...

    @property
    def state(self) -> RegistryState: ...


def admit(app: Admitting, *, degraded_hint: bool) -> None:
    """Raise the refusal of a Dispatch by this coordinator (standby, isolated master, registry not
    authoritative yet), if any."""
    lead = app.leadership
    refusal = admission(lead.role, isolated=lead.isolated, degraded_hint=degraded_hint, master=lead.holder)
    if refusal is not None:
        raise refusal
    if not app.state.authoritative:
        raise Unavailable(
            f"{NOT_SYNCED}: this coordinator has not received its instance set yet "
            "(restarted, waiting for the controller's SetInstances or a first `motor register`); retry shortly",
            reason="REGISTRY_NOT_SYNCED",
        )


def _degraded_hint(metadata: Any) -> bool:
    return any(k == DEGRADED_HEADER and v == "1" for k, v in metadata)
