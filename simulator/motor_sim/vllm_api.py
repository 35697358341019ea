"""vLLM-specific behaviour: error body, ids, model cards and the NIXL-style PD protocol.

Prefill (kv_producer/kv_both) given ``kv_transfer_params.do_remote_decode``: runs the request,
pins its KV blocks under a lease (``--sim-kv-lease-s`` / VLLM_NIXL_ABORT_REQUEST_TIMEOUT) and
returns NixlConnector's ``kv_transfer_params`` (vLLM 0.32's fields, block ids per cache group).
Decode (kv_consumer/kv_both) given ``do_remote_prefill``: fetches the blocks over the side channel.
A failed load follows vLLM's ``kv_transfer_config.kv_load_failure_policy``:

* ``fail`` (vLLM's default): the request errors — HTTP 500 ``InternalServerError`` "Internal
  server error"; streamed, a 200 whose first event (after chat's role chunk) is that error object,
  then ``[DONE]``; counted in ``motor_sim:kv_load_failures_total``.
* ``recompute``: the decode recomputes the prefill locally, logs a warning, counts
  ``motor_sim:kv_transfer_fallbacks_total`` and answers with ``x-motor-sim-kv-fallback: 1``.
"""

from __future__ import annotations

import hashlib
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


def _short_uuid() -> str:
    return uuid.uuid4().hex[:16]  # vLLM 0.32's random_uuid(): 16 hex digits


class VLLMFlavour:
    name = "vllm"
    # vLLM echoes X-Request-Id only with --enable-request-id-headers (SimConfig.request_id_headers)
    echo_request_id = True

    def request_id(self, header: str | None, job: Job | None) -> str:
        base = header or (job.request_id if job is not None else None) or _short_uuid()
        return f"{base}-{next(_counter):x}"

    def response_id(self, rid: str, kind: str) -> str:
        base = rid.rsplit("-", 1)[0]
        return f"chatcmpl-{base}" if kind == "chat" else f"cmpl-{base}"

    def check_model(self, svc: SimService, model: str | None) -> None:
        if model is not None and model not in svc.cfg.served_model_names:
            names = ", ".join(svc.cfg.served_model_names)
            raise ApiError(404, f"The model `{model}` does not exist. Valid aliases: {names}.",
                           "NotFoundError", "model")

    def error_body(self, err: ApiError) -> dict[str, Any]:
        if err.validation:  # FastAPI/pydantic request validation
            loc = f"body.{err.param}" if err.param else "body"
            detail = {"type": "value_error", "loc": loc, "msg": err.message, "input": err.value}
            return {"error": {"message": f"1 validation error:\n  {detail}", "type": "Bad Request",
                              "param": loc if err.param else None, "code": err.status}}
        message = err.message
        extras = [f"parameter={err.param}"] if err.param and err.value is not None else []
        if err.value is not None and extras:
            extras.append(f"value={err.value}")
        if extras:  # VLLMValidationError.__str__
            message = f"{message} ({', '.join(extras)})"
        return {"error": {"message": message, "type": err.err_type, "param": err.param,
                          "code": err.status}}

    def shape(self, svc: SimService, run: Run, body: dict[str, Any], where: str) -> dict[str, Any]:
        """Add the fields vLLM 0.32 puts on its OpenAI bodies (all null unless asked for), as
        observed on the real engine (tests/realengine). *where*: full | role | chunk | usage."""
        job = run.job
        chat = job.kind == "chat"
        fp = fingerprint(svc)
        if where == "full":
            for ch in body["choices"]:
                if chat:
                    ch["message"].update(refusal=None, annotations=None, audio=None,
                                         function_call=None, reasoning=None)
                    ch.update(token_ids=None, routed_experts=None)
                else:
                    ch.update(token_ids=None, prompt_logprobs=None, prompt_token_ids=None,
                              routed_experts=None)
            body["usage"]["completion_tokens_details"] = None
            body.update(service_tier=None, system_fingerprint=fp, ec_transfer_params=None,
                        metrics=None)
            if chat:
                body.update(prompt_token_ids=None, prompt_text=None)
            else:
                body.pop("prompt_logprobs", None)  # per choice on completions
        elif where == "role":
            body.update(prompt_token_ids=None, prompt_text=None)
        elif where == "chunk":
            last = all(d.finish_reason is not None for d in run.decoders)
            for ch in body["choices"]:
                if chat:
                    if ch.get("finish_reason") is None:
                        ch.pop("stop_reason", None)
                    ch["token_ids"] = None
                else:
                    ch.update(prompt_token_ids=None, token_ids=None)
            if "usage" in body:
                body["usage"].pop("prompt_tokens_details", None)
            if last and not job.include_usage and any(
                ch.get("finish_reason") is not None for ch in body["choices"]
            ):
                body["system_fingerprint"] = fp
        elif where == "usage":
            body["usage"].pop("prompt_tokens_details", None)
            body["system_fingerprint"] = fp
        return body

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
                if svc.injected_kv_load_failure():
                    raise TransferError("NIXL handshake failed (fault injection kv_load_fail)")
                kv = await side_channel.fetch(ktp, svc.cfg.kv_fetch_timeout_s)
                if kv.prompt_token_ids != job.prompt_ids:
                    raise TransferError("transferred KV belongs to a different prompt")
            except TransferError as exc:
                if svc.cfg.kv_load_failure_policy == "recompute":
                    svc.stats.kv_transfer_fallbacks += 1
                    log.warning("KV transfer for request %s failed (%s); recomputing prefill locally",
                                rid, exc)
                    return Plan(fallback_reason=str(exc))
                svc.stats.kv_load_failures += 1
                log.error("KV load for request %s failed (%s); failing the request "
                          "(kv_load_failure_policy=fail)", rid, exc)
                return Plan(kv_load_failed=str(exc))
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
        # permission id: modelperm-<16 hex>, like vLLM 0.32
        return {
            "id": name, "object": "model", "created": int(svc.started), "owned_by": "vllm",
            "root": svc.cfg.model, "parent": None, "max_model_len": svc.cfg.max_model_len,
            "permission": [{
                "id": f"modelperm-{uuid.uuid5(uuid.NAMESPACE_OID, name).hex[:16]}",
                "object": "model_permission", "created": int(time.time()),
                "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                "organization": "*", "group": None, "is_blocking": False,
            }],
        }


def fingerprint(svc: SimService) -> str:
    """``system_fingerprint``: vllm-<version>-<8 hex> (the suffix is a config hash in vLLM)."""
    digest = hashlib.blake2b(f"{svc.cfg.model}|{svc.cfg.max_model_len}".encode(), digest_size=4)
    return f"vllm-{svc.cfg.version}-{digest.hexdigest()}"
