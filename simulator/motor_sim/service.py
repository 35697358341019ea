"""The engine-independent core of one simulator process: state plus the generation pipeline.

Errors::

    ApiError(status, message, err_type, param)   -> rendered by the flavour as its error body
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from motor_common.kv_events import Flavour as EventFlavour
from motor_common.kv_events import block_hashes as engine_block_hashes
from motor_sim.config import Flavour, SimConfig
from motor_sim.costmodel import CostModel
from motor_sim.faults import Fault, FaultMode
from motor_sim.generator import VOCAB, Context, Decoder, Step, sequence_digest
from motor_sim.kvcache import BlockManager, blocks_for
from motor_sim.kvtransfer import KVPayload, Lease, LeaseTable, RoomTable
from motor_sim.params import Job
from motor_sim.scheduler import Engine, Stats

log = logging.getLogger("motor_sim")

# Token steps (over all choices) a zero-latency request runs before it yields to the event loop.
_YIELD_STEPS = 256


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, err_type: str = "BadRequestError", param: str | None = None,
        *, value: Any = None, validation: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param
        self.value = value  # the offending value, when the engine reports it
        self.validation = validation  # a schema/type error rather than a semantic one


@dataclass
class Plan:
    """How the PD protocol shapes one request (decided by the flavour before generation)."""

    remote_kv: KVPayload | None = None  # KV received from a prefill engine: skip prefill
    first_token: int | None = None  # SGLang decode: first token computed by the prefill engine
    force_max_tokens: int | None = None  # SGLang prefill: one token only
    pin_lease: bool = False  # vLLM producer: pin blocks for a remote decode
    publish_room: int | None = None  # SGLang prefill: hand the KV to the decode on this room
    fallback_reason: str | None = None  # decode recomputed the prefill locally
    kv_load_failed: str | None = None  # decode could not load the KV (policy "fail"): answer an error


@dataclass
class Run:
    """One request in flight; filled in as generation proceeds."""

    rid: str
    job: Job
    plan: Plan
    created: int = field(default_factory=lambda: int(time.time()))
    context: Context | None = None  # after the prompt
    decoders: list[Decoder] = field(default_factory=list)
    cached_tokens: int = 0
    kv_transfer_params: dict[str, Any] | None = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.job.prompt_ids)

    @property
    def completion_tokens(self) -> int:
        return sum(len(d.token_ids) for d in self.decoders)


class SimService:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.engine_id = cfg.engine_id or str(uuid.uuid4())
        self.blocks = BlockManager(cfg.num_kv_blocks, cfg.block_size, cfg.enable_prefix_caching)
        if cfg.kv_events is not None:
            # hash blocks the engine's way so the published hashes are the engine's
            ev_flavour = EventFlavour(cfg.flavour.value)
            as_int = os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1") != "0"  # vLLM's env
            self.blocks.hasher = lambda ids, bs: engine_block_hashes(ev_flavour, ids, bs, int_hashes=as_int)
        self.engine = Engine(self.blocks, cfg.cost, cfg.max_num_seqs)
        self.leases = LeaseTable(self.engine_id)
        self.rooms = RoomTable()
        self.fault = Fault()
        self.kv_load_failures_left = 0  # kv_load_fail fault: -1 = every load
        self.base_cost: CostModel = cfg.cost
        self.started = time.time()

    @property
    def stats(self) -> Stats:
        return self.engine.stats

    def set_fault(self, fault: Fault) -> None:
        self.fault = fault
        self.kv_load_failures_left = (fault.count or -1) if fault.mode is FaultMode.KV_LOAD_FAIL else 0
        if fault.mode is FaultMode.SLOW:
            self.engine.cost = self.base_cost.slowed(fault.factor)
            self.engine.extra_token_delay_s = (
                fault.token_delay_ms / 1000.0 if self.base_cost.zero_latency else 0.0
            )
        else:
            self.engine.cost = self.base_cost
            self.engine.extra_token_delay_s = 0.0

    def injected_kv_load_failure(self) -> bool:
        """Consume one injected KV-load failure (fault ``kv_load_fail``), if any is left."""
        if self.kv_load_failures_left == 0:
            return False
        if self.kv_load_failures_left > 0:
            self.kv_load_failures_left -= 1
        return True

    @property
    def salt(self) -> str:
        return self.fault.salt if self.fault.mode is FaultMode.WRONG_ANSWERS else ""

    def resolve_max_tokens(self, job: Job) -> int:
        if self.cfg.flavour is Flavour.VLLM:
            return self._vllm_max_tokens(job)
        room = self.cfg.max_model_len - len(job.prompt_ids)
        if room <= 0 or (job.max_tokens is not None and job.max_tokens > room):
            asked = job.max_tokens if job.max_tokens is not None else 0
            least = "" if job.prompt_complete else "at least "
            raise ApiError(
                400,
                f"This model's maximum context length is {self.cfg.max_model_len} tokens. "
                f"However, you requested {least}{len(job.prompt_ids) + asked} tokens "
                f"({least}{len(job.prompt_ids)} in the messages, {asked} in the completion). "
                "Please reduce the length of the messages or completion.",
                param="max_tokens" if job.max_tokens is not None else "messages",
            )
        if job.max_tokens is not None:
            return job.max_tokens
        return min(room, self.cfg.default_max_tokens)

    def _vllm_max_tokens(self, job: Job) -> int:
        """vLLM 0.32 (checked against the real engine): a prompt longer than the context is
        refused, max_tokens above max_model_len is refused, otherwise max_tokens is clamped to the
        room left; without max_tokens, completions take 16 and chat the room (capped here by
        ``--sim-default-max-tokens`` to keep simulated runs short)."""
        limit, n_prompt = self.cfg.max_model_len, len(job.prompt_ids)
        if n_prompt > limit:
            count = str(n_prompt) if job.prompt_complete else f"at least {n_prompt}"
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your prompt "
                f"contains {count} input tokens, which exceeds this limit even without any "
                "output tokens. Please reduce the length of the input prompt.",
                param="input_tokens", value=n_prompt,
            )
        asked = job.max_tokens
        if asked is not None and asked > limit:
            raise ApiError(400, f"max_tokens={asked} cannot be greater than max_model_len={limit}. "
                           "Please request fewer output tokens.", param="max_tokens", value=asked)
        room = limit - n_prompt
        if room <= 0:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your prompt "
                f"contains {n_prompt} input tokens, which leaves no room for output tokens. "
                "Please reduce the length of the input prompt.",
                param="input_tokens", value=n_prompt,
            )
        if asked is None:
            asked = 16 if job.kind == "completion" else self.cfg.default_max_tokens
        return min(asked, room)

    def check_logprobs(self, job: Job) -> None:
        """vLLM's ``SamplingParams._validate_logprobs``: more top logprobs per token than
        ``--max-logprobs`` (default 20; -1 = the vocabulary) is a 400, never work for the engine.
        SGLang has no such bound; the simulator's vocabulary bounds the work there."""
        if self.cfg.flavour is not Flavour.VLLM or not job.logprobs:
            return
        limit = self.cfg.max_logprobs if self.cfg.max_logprobs != -1 else len(VOCAB)
        asked = job.logprobs if job.logprobs != -1 else len(VOCAB)
        if asked > limit:
            raise ApiError(400, f"Requested sample logprobs of {asked}, which is greater than max "
                           f"allowed: {limit}", param="logprobs", value=asked)

    def check_fits(self, job: Job, max_tokens: int) -> int:
        total = len(job.prompt_ids) + job.n * max_tokens
        if blocks_for(total, self.cfg.block_size) > self.cfg.num_kv_blocks:
            raise ApiError(400, f"request needs {total} KV slots, more than the whole cache")
        return total

    def sweep_leases(self) -> int:
        gone = self.leases.expire(time.monotonic())
        for lease in gone:
            self.engine.free_blocks(lease.request_id)
            self.stats.kv_lease_expirations += 1
            log.warning("KV lease for request %s expired; blocks freed", lease.request_id)
        return len(gone)

    def release_lease(self, lease: Lease) -> None:
        self.engine.free_blocks(lease.request_id)

    async def generate(self, run: Run) -> AsyncGenerator[list[tuple[int, Step]], None]:
        """Admit, prefill, and decode; yields the steps of each iteration. Close with aclosing."""
        job, plan, engine = run.job, run.plan, self.engine
        max_tokens = self.resolve_max_tokens(job)
        total = self.check_fits(job, max_tokens)
        if plan.force_max_tokens is not None:
            max_tokens = plan.force_max_tokens
        alloc = await engine.admit(run.rid, job.prompt_ids, total)
        keep_blocks = False
        finished = False
        try:
            run.cached_tokens = alloc.cached_tokens
            st = engine.stats
            st.prompt_tokens_local_cache_hit += alloc.cached_tokens
            if plan.remote_kv is not None:
                await engine.transfer(plan.remote_kv.num_blocks)
                st.prompt_tokens_external_kv_transfer += len(job.prompt_ids) - alloc.cached_tokens
            else:
                await engine.prefill(len(job.prompt_ids) - alloc.cached_tokens)
                st.prompt_tokens_local_compute += len(job.prompt_ids) - alloc.cached_tokens
            model = self.cfg.primary_name
            run.context = ctx = sequence_digest(model, job.prompt_ids, job.key, self.salt)
            greedy = job.key.temperature == 0.0
            run.decoders = [
                Decoder(
                    ctx,
                    0 if greedy else i,
                    max_tokens,
                    job.stop,
                    job.include_stop_str,
                    # the prefill engine sampled choice 0's first token; the others sample here
                    first_token=plan.first_token if i == 0 else None,
                )
                for i in range(job.n)
            ]
            first = [(i, d.step()) for i, d in enumerate(run.decoders)]
            if plan.publish_room is not None:
                payload = KVPayload(
                    job.prompt_ids, first[0][1].token_id, self.engine_id, len(alloc.block_ids)
                )
                await self.rooms.publish(plan.publish_room, payload, self.cfg.bootstrap_timeout_s)
            yield first
            work = 0
            while True:
                live = [(i, d) for i, d in enumerate(run.decoders) if not d.finished]
                if not live:
                    break
                delay = engine.decode_delay_s()
                if delay > 0:
                    await asyncio.sleep(delay)
                    work = 0
                else:
                    # Zero latency: give the loop back every _YIELD_STEPS token steps, so a request
                    # with a huge n or max_tokens never starves the others or /health.
                    work += len(live)
                    if work >= _YIELD_STEPS:
                        work = 0
                        await asyncio.sleep(0)
                yield [(i, d.step()) for i, d in live]
            if plan.pin_lease:
                run.kv_transfer_params = self._pin(run, alloc.block_ids)
                keep_blocks = True
            finished = True
        finally:
            engine.finish(run.rid, keep_blocks=keep_blocks)
            st = engine.stats
            st.prompt_tokens += len(job.prompt_ids)
            st.generation_tokens += run.completion_tokens
            if finished:
                st.requests_finished += 1
                for d in run.decoders:
                    if d.finish_reason == "stop":
                        st.finished_stop += 1
                    else:
                        st.finished_length += 1
            else:
                st.requests_aborted += 1

    def _pin(self, run: Run, block_ids: tuple[int, ...]) -> dict[str, Any]:
        first = run.decoders[0].token_ids[0]
        payload = KVPayload(run.job.prompt_ids, first, self.engine_id, len(block_ids))
        self.leases.put(
            Lease(run.rid, block_ids, payload, time.monotonic() + self.cfg.kv_lease_s)
        )
        # NixlConnector (pull mode) of vLLM 0.32, request_finished() on the producer: block ids
        # per KV cache group (one group here), the tokens whose KV is pinned, the parallel sizes
        # (the key order of the real engine's answer, checked against it in tests/realengine).
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [list(block_ids)],
            "remote_engine_id": self.engine_id,
            "remote_request_id": run.rid,
            "remote_host": self.cfg.side_channel_host,
            "remote_port": self.cfg.side_channel_port,
            "tp_size": self.cfg.tp_size,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": len(run.job.prompt_ids),
            "remote_blocks_expiry_time": None,
            "transfer_mode": "pull",
            "remote_prefill_cached_tokens": run.cached_tokens,  # the scheduler adds the P-side hits
        }
