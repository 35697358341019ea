"""OpenAI response and SSE chunk bodies, shaped per flavour through ``Shapes`` hooks (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from motor_sim.generator import Decoder, Step, logprob_of, top_alternatives, word_for
from motor_sim.service import Run


class Shapes(Protocol):
    """Per-engine details of the OpenAI shapes."""

    def choice_extras(self, d: Decoder | None, step: Step | None) -> dict[str, Any]: ...

    def top_extras(self, run: Run) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Ids:
    response_id: str
    model: str


def usage(run: Run) -> dict[str, Any]:
    p, c = run.prompt_tokens, run.completion_tokens
    return {"prompt_tokens": p, "total_tokens": p + c, "completion_tokens": c,
            "prompt_tokens_details": None}


def _completion_logprobs(run: Run, d: Decoder, positions: range, k: int, offset: int) -> dict[str, Any]:
    tokens: list[str] = []
    lps: list[float] = []
    tops: list[dict[str, float]] = []
    offsets: list[int] = []
    for pos in positions:
        tid = d.token_ids[pos]
        text = " " + word_for(tid)
        offsets.append(offset)
        offset += len(text)
        tokens.append(text)
        lps.append(logprob_of(d.contexts[pos], d.choice))
        if k != 0:  # -1: the whole vocabulary
            tops.append({" " + word_for(t): lp for t, lp in top_alternatives(d.contexts[pos], d.choice, k)})
    return {"text_offset": offsets, "token_logprobs": lps, "tokens": tokens,
            "top_logprobs": tops if k != 0 else None}


def _chat_logprobs(run: Run, d: Decoder, positions: range, k: int) -> dict[str, Any]:
    content = []
    for pos in positions:
        tid = d.token_ids[pos]
        text = " " + word_for(tid)
        content.append({
            "token": text,
            "logprob": logprob_of(d.contexts[pos], d.choice),
            "bytes": list(text.encode()),
            "top_logprobs": [
                {"token": " " + word_for(t), "logprob": lp, "bytes": list((" " + word_for(t)).encode())}
                for t, lp in top_alternatives(d.contexts[pos], d.choice, k)
            ] if k != 0 else [],
        })
    return {"content": content}


def full_response(run: Run, ids: Ids, shapes: Shapes) -> dict[str, Any]:
    job = run.job
    choices = []
    for idx, d in enumerate(run.decoders):
        positions = range(len(d.token_ids))
        if job.kind == "chat":
            choice: dict[str, Any] = {
                "index": idx,
                "message": {"role": "assistant", "content": d.text},
                "logprobs": _chat_logprobs(run, d, positions, job.logprobs or 0)
                if job.logprobs is not None else None,
                "finish_reason": d.finish_reason,
            }
        else:
            choice = {
                "index": idx,
                "text": d.text,
                "logprobs": _completion_logprobs(run, d, positions, job.logprobs, 0)
                if job.logprobs is not None else None,
                "finish_reason": d.finish_reason,
            }
        choice.update(shapes.choice_extras(d, None))
        choices.append(choice)
    body: dict[str, Any] = {
        "id": ids.response_id,
        "object": "chat.completion" if job.kind == "chat" else "text_completion",
        "created": run.created,
        "model": ids.model,
        "choices": choices,
        "usage": usage(run),
    }
    body.update(shapes.top_extras(run))
    return body


def chunk(run: Run, ids: Ids, shapes: Shapes, steps: list[tuple[int, Step]],
          first: bool) -> list[dict[str, Any]]:
    """The SSE chunks for one iteration (one per choice that produced visible output)."""
    job = run.job
    out: list[dict[str, Any]] = []
    obj = "chat.completion.chunk" if job.kind == "chat" else "text_completion"
    for idx, step in steps:
        d = run.decoders[idx]
        if not step.text and not step.finished and not (first and job.kind == "chat"):
            continue
        pos = range(len(d.token_ids) - 1, len(d.token_ids))
        if job.kind == "chat":
            delta: dict[str, Any] = {"content": step.text}
            if first:
                delta = {"role": "assistant", "content": step.text}
            choice: dict[str, Any] = {
                "index": idx, "delta": delta,
                "logprobs": _chat_logprobs(run, d, pos, job.logprobs or 0)
                if job.logprobs is not None else None,
                "finish_reason": step.finish_reason,
            }
        else:
            choice = {
                "index": idx, "text": step.text,
                "logprobs": _completion_logprobs(run, d, pos, job.logprobs, 0)
                if job.logprobs is not None else None,
                "finish_reason": step.finish_reason,
            }
        choice.update(shapes.choice_extras(d, step))
        c: dict[str, Any] = {"id": ids.response_id, "object": obj, "created": run.created,
                             "model": ids.model, "choices": [choice]}
        if job.include_usage and job.continuous_usage:
            c["usage"] = usage(run)
        out.append(c)
    return out


def usage_chunk(run: Run, ids: Ids) -> dict[str, Any]:
    obj = "chat.completion.chunk" if run.job.kind == "chat" else "text_completion"
    return {"id": ids.response_id, "object": obj, "created": run.created, "model": ids.model,
            "choices": [], "usage": usage(run)}
