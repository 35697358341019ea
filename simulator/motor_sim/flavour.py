"""What differs between the simulated engines, behind one Protocol (implemented by
``vllm_api.VLLMFlavour`` and ``sglang_api.SGLangFlavour``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from motor_sim.generator import Decoder, Step
from motor_sim.kvtransfer import TransferError
from motor_sim.params import Job
from motor_sim.service import ApiError, Plan, Run, SimService


class Flavour(Protocol):
    name: str
    echo_request_id: bool

    def request_id(self, header: str | None, job: Job | None) -> str: ...

    def response_id(self, rid: str, kind: str) -> str: ...

    def check_model(self, svc: SimService, model: str | None) -> None: ...

    def error_body(self, err: ApiError) -> dict[str, Any]: ...

    async def plan(self, svc: SimService, job: Job, rid: str) -> Plan: ...

    def transfer_failed(self, rid: str, job: Job, exc: TransferError) -> ApiError: ...

    def choice_extras(self, d: Decoder | None, step: Step | None) -> dict[str, Any]: ...

    def top_extras(self, run: Run) -> dict[str, Any]: ...

    def shape(self, svc: SimService, run: Run, body: dict[str, Any], where: str) -> dict[str, Any]:
        """Final per-engine touches on a body: where = full | role | chunk | usage."""
        ...

    def model_card(self, svc: SimService, name: str) -> Mapping[str, Any]: ...
