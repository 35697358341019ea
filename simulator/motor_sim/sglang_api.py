"""SGLang-specific behaviour: error body, ids, model cards and the bootstrap-room PD protocol.

``--disaggregation-mode prefill``: a request must carry ``bootstrap_room``; the engine prefills,
offers the KV on its bootstrap port and answers (one token, finish_reason "length") once a decode
engine took it. ``--disaggregation-mode decode``: connects to ``bootstrap_host:bootstrap_port``,
waits for the room (``SGLANG_DISAGGREGATION_WAITING_TIMEOUT``), then decodes from the received
first token; a room that never comes fails with SGLang's "Decode transfer failed" 500 error.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from motor_sim import bootstrap
from motor_sim.config import Role
from motor_sim.generator import Decoder, Step
from motor_sim.kvtransfer import TransferError
from motor_sim.params import Job
from motor_sim.service import ApiError, Plan, Run, SimService

log = logging.getLogger("motor_sim.sglang")


class SGLangFlavour:
    name = "sglang"
    echo_request_id = False

    def request_id(self, header: str | None, job: Job | None) -> str:
        return uuid.uuid4().hex

    def response_id(self, rid: str, kind: str) -> str:
        return rid

    def check_model(self, svc: SimService, model: str | None) -> None:
        return None  # SGLang serves whatever model name the request carries

    def error_body(self, err: ApiError) -> dict[str, Any]:
        return {"object": "error", "message": err.message, "type": err.err_type,
                "param": err.param, "code": err.status}

    async def plan(self, svc: SimService, job: Job, rid: str) -> Plan:
        role = svc.cfg.role
        if role in (Role.UNION, Role.BOTH):
            return Plan()
        room = job.bootstrap_room
        if room is None:
            raise ApiError(400, "Disaggregated request received without bootstrap room id")
        if role is Role.PREFILL:
            return Plan(force_max_tokens=1, publish_room=room)
        if not job.bootstrap_host:
            raise ApiError(400, "Disaggregated decode request received without bootstrap_host",
                           param="bootstrap_host")
        port = job.bootstrap_port if job.bootstrap_port is not None else svc.cfg.bootstrap_port
        try:
            kv = await bootstrap.fetch_room(job.bootstrap_host, port, room,
                                            svc.cfg.waiting_timeout_s)
            if kv.prompt_token_ids != job.prompt_ids:
                raise TransferError("transferred KV belongs to a different prompt")
        except TransferError as exc:
            msg = (f"Decode transfer failed for request rank=0 decode_req.req.rid='{rid}' "
                   f"decode_req.req.bootstrap_room={room} with exception "
                   f"KVTransferError(bootstrap_room={room}): {exc}")
            log.error("%s", msg)
            raise ApiError(500, msg, "InternalServerError") from exc
        return Plan(remote_kv=kv, first_token=kv.first_token_id)

    def transfer_failed(self, rid: str, job: Job, exc: TransferError) -> ApiError:
        room = job.bootstrap_room
        msg = (f"Prefill transfer failed for request rank=0 req.rid='{rid}' "
               f"req.bootstrap_room={room} with exception "
               f"KVTransferError(bootstrap_room={room}): {exc}")
        log.warning("%s", msg)
        return ApiError(500, msg, "InternalServerError")

    def choice_extras(self, d: Decoder | None, step: Step | None) -> dict[str, Any]:
        stop = step.stop_reason if step is not None else (d.stop_reason if d else None)
        return {"matched_stop": stop}

    def top_extras(self, run: Run) -> dict[str, Any]:
        return {}

    def shape(self, svc: SimService, run: Run, body: dict[str, Any], where: str) -> dict[str, Any]:
        return body

    def model_card(self, svc: SimService, name: str) -> Mapping[str, Any]:
        return {"id": name, "object": "model", "created": int(svc.started), "owned_by": "sglang",
                "root": svc.cfg.model, "max_model_len": svc.cfg.max_model_len}
