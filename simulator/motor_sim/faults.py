"""Fault-injection state and its validation (pure, no I/O).

Modes: none, crash (exit non-zero), hang (stop answering), health_503, slow_health (``/health``
answers after ``delay_s``, as a busy engine's API server does; generation unaffected), slow, wrong_answers,
kv_load_fail (a vLLM decode's next ``count`` KV loads fail, as a NIXL handshake that timed out;
0 = every load until the fault is cleared), engine_error (every generation request answers HTTP
500 with the engine's internals in the body, as an engine-side exception does), poison (a request whose body contains ``match``
blocks the event loop for ever: an engine bug that one request triggers), freeze_after_head (the
next streamed answer gets its head, then the whole engine freezes: a vLLM API server sends a
stream's headers before the first token), refuse_start (start-up only).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class FaultMode(enum.Enum):
    NONE = "none"
    CRASH = "crash"
    HANG = "hang"
    HEALTH_503 = "health_503"
    SLOW_HEALTH = "slow_health"
    SLOW = "slow"
    WRONG_ANSWERS = "wrong_answers"
    KV_LOAD_FAIL = "kv_load_fail"
    ENGINE_ERROR = "engine_error"
    REFUSE_START = "refuse_start"
    POISON = "poison"
    FREEZE_AFTER_HEAD = "freeze_after_head"


class InvalidFault(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Fault:
    mode: FaultMode = FaultMode.NONE
    exit_code: int = 1  # crash
    delay_s: float = 0.0  # crash: after this many seconds; slow_health: /health answers after it
    factor: float = 10.0  # slow: multiply every latency
    token_delay_ms: float = 50.0  # slow: extra per-token delay (also in zero-latency mode)
    hard: bool = False  # hang: block the whole event loop (admin endpoint stops too)
    salt: str = "wrong"  # wrong_answers: perturbs the generator
    count: int = 0  # kv_load_fail: failures before the loads succeed again (0 = all of them)
    match: str = ""  # poison: the bytes in a request body that hang the engine

    @property
    def health_status(self) -> str:
        """healthy | unhealthy | dead, as published on the vllm_fault topic."""
        if self.mode is FaultMode.CRASH:
            return "dead"
        if self.mode in (FaultMode.HANG, FaultMode.HEALTH_503):
            return "unhealthy"
        return "healthy"

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "exit_code": self.exit_code,
            "delay_s": self.delay_s,
            "factor": self.factor,
            "token_delay_ms": self.token_delay_ms,
            "hard": self.hard,
            "salt": self.salt,
            "count": self.count,
            "match": self.match,
        }


MAX_DELAY_S = 3600.0  # crash / slow_health: a fault lasts for a test, not for ever

_FIELDS = {"mode", "exit_code", "delay_s", "factor", "token_delay_ms", "hard", "salt", "count", "match"}


def parse_fault(body: Any) -> Fault:
    """Validate a ``POST /sim/fault`` body; unknown fields are rejected."""
    if not isinstance(body, Mapping):
        raise InvalidFault("body must be a JSON object")
    unknown = set(body) - _FIELDS
    if unknown:
        raise InvalidFault(f"unknown fields: {sorted(unknown)}")
    try:
        mode = FaultMode(body.get("mode", "none"))
    except ValueError as exc:
        raise InvalidFault(f"unknown mode {body.get('mode')!r}") from exc
    if mode is FaultMode.REFUSE_START:
        raise InvalidFault("refuse_start only applies at start-up (--sim-fault refuse_start)")
    try:
        fault = Fault(
            mode=mode,
            exit_code=int(body.get("exit_code", 1)),
            delay_s=float(body.get("delay_s", 0.0)),
            factor=float(body.get("factor", 10.0)),
            token_delay_ms=float(body.get("token_delay_ms", 50.0)),
            hard=bool(body.get("hard", False)),
            salt=str(body.get("salt", "wrong")),
            count=int(body.get("count", 0)),
            match=str(body.get("match", "")),
        )
    except (TypeError, ValueError) as exc:
        raise InvalidFault(str(exc)) from exc
    if fault.exit_code == 0 or not 0 < fault.exit_code < 256:
        raise InvalidFault("exit_code must be in 1..255")
    if fault.mode is FaultMode.POISON and not fault.match:
        raise InvalidFault("poison needs a non-empty 'match' (the bytes of the poison request)")
    if fault.factor <= 0 or fault.delay_s < 0 or fault.token_delay_ms < 0:
        raise InvalidFault("factor must be > 0, delays >= 0")
    if fault.delay_s > MAX_DELAY_S:
        raise InvalidFault(f"delay_s must be at most {MAX_DELAY_S:g} s")
    if fault.count < 0:
        raise InvalidFault("count must be >= 0")
    return fault
