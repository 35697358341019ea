"""vLLM-specific behaviour: error body, ids, model cards and the NIXL-style PD protocol.

Prefill (kv_producer/kv_both) given ``kv_transfer_params.do_remote_decode``: runs the request,
pins its KV blocks under a lease (``--sim-kv-lease-s`` / VLLM_NIXL_ABORT_REQUEST_TIMEOUT) and
returns NixlConnector's ``kv_transfer_params``. Decode (kv_consumer/kv_both) given
``do_remote_prefill``: fetches the blocks over the side channel; on any failure it recomputes the
prefill locally, logs a warning, counts ``motor_sim:kv_transfer_fallbacks_total`` and answers with
``x-motor-sim-kv-fallback: 1``.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

from motor_sim import side_channel
from motor_sim.generator import Decoder, Step
from motor_sim.kvtransfer import TransferError
from motor_sim.params import Job
from motor_sim.service import ApiError, Plan, Run, SimService

log = logging.getLogger("motor_sim.vllm")
_counter = itertools.count()


class VLLMFlavour:
    name = "vllm"
    echo_request_id = True

    def request_id(self, header: str | None, job: Job | None) -> str:
        base = header or (job.request_id if job is not None else None) or uuid.uuid4().hex
        return f"{base}-{next(_counter):x}"

    def response_id(self, rid: str, kind: str) -> str:
        base = rid.rsplit("-", 1)[0]
        return f"chatcmpl-{base}" if kind == "chat" else f"cmpl-{base}"

    def check_model(self, svc: SimService, model: str | None) -> None:
        if model is not None and model not in svc.cfg.served_model_names:
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")

    def error_body(self, err: ApiError) -> dict[str, Any]:
        return {"error": {"message": err.message, "type": err.err_type, "param": err.param,
                          "code": err.status}}

    async def plan(self, svc: SimService, job: Job, rid: str) -> Plan:
        ktp = job.kv_transfer_params
        if not ktp or svc.cfg.kv_transfer_config is None:
            return Plan()  # no connector configured: vLLM ignores the params
        if ktp.get("do_remote_decode"):
            if not svc.cfg.is_producer:
                raise ApiError(400, "do_remote_decode requires kv_role kv_producer or kv_both",
                               param="kv_transfer_params")
            return Plan(pin_lease=True)
        if ktp.get("do_remote_prefill"):
            if not svc.cfg.is_consumer:
                raise ApiError(400, "do_remote_prefill requires kv_role kv_consumer or kv_both",
                               param="kv_transfer_params")
            try:
                kv = await side_channel.fetch(ktp, svc.cfg.kv_fetch_timeout_s)
                if kv.prompt_token_ids != job.prompt_ids:
                    raise TransferError("transferred KV belongs to a different prompt")
            except TransferError as exc:
                svc.stats.kv_transfer_fallbacks += 1
                log.warning("KV transfer for request %s failed (%s); recomputing prefill locally",
                            rid, exc)
                return Plan(fallback_reason=str(exc))
            return Plan(remote_kv=kv)
        return Plan()

    def transfer_failed(self, rid: str, job: Job, exc: TransferError) -> ApiError:
        return ApiError(500, f"KV transfer failed for request {rid}: {exc}", "InternalServerError")

    def choice_extras(self, d: Decoder | None, step: Step | None) -> dict[str, Any]:
        if step is not None:
            return {"stop_reason": step.stop_reason}
        return {"stop_reason": d.stop_reason if d is not None else None}

    def top_extras(self, run: Run) -> dict[str, Any]:
        return {"system_fingerprint": None, "prompt_logprobs": None,
                "kv_transfer_params": run.kv_transfer_params}

    def model_card(self, svc: SimService, name: str) -> Mapping[str, Any]:
        return {
            "id": name, "object": "model", "created": int(svc.started), "owned_by": "vllm",
            "root": svc.cfg.model, "parent": None, "max_model_len": svc.cfg.max_model_len,
            "permission": [{
                "id": f"modelperm-{uuid.uuid5(uuid.NAMESPACE_OID, name).hex}",
                "object": "model_permission", "created": int(time.time()),
                "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                "organization": "*", "group": None, "is_blocking": False,
            }],
        }
