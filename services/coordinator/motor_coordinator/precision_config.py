"""Configuration of the precision monitor (SPEC §3.5): the ``precision`` section of the coordinator.

``precision_clear_threshold`` stays a top-level key (the seed's name, SPEC §6).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PrecisionPrompt:
    """One probe: a completions ``prompt`` or chat ``messages`` (exactly one), and the expected
    greedy answer. Without ``expected`` the answer is learned once from the first probe round
    (the majority answer across P/D groups; docs/precision.md)."""

    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    expected: str | None = None

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("precision.prompts[]: set exactly one of 'prompt' and 'messages'")
        if self.messages is not None and not self.messages:
            raise ValueError("precision.prompts[].messages must not be empty")


DEFAULT_PROMPTS = (PrecisionPrompt(prompt="The capital of France is"),)


@dataclass(frozen=True)
class PrecisionConfig:
    # Off by default: probes cost engine time; turn on per deployment.
    enabled: bool = False
    # Seconds between probe rounds (one round probes every P/D group with every prompt).
    interval_sec: float = 30.0
    prompts: tuple[PrecisionPrompt, ...] = field(default_factory=lambda: DEFAULT_PROMPTS)
    max_tokens: int = 16
    # Sampling seed sent with every probe (temperature is always 0).
    seed: int = 0
    # Bound of one probe request (prefill + decode).
    timeout_sec: float = 10.0
    # Groups probed at the same time.
    concurrency: int = 4
    # Retry interval of an alarm report the controller did not accept.
    report_retry_interval_sec: float = 1.0
    # Timeout of one ReportAlarm call.
    report_timeout_sec: float = 2.0

    def __post_init__(self) -> None:
        if self.interval_sec <= 0 or self.timeout_sec <= 0 or self.report_retry_interval_sec <= 0:
            raise ValueError("precision.interval_sec, timeout_sec and report_retry_interval_sec must be > 0")
        if self.report_timeout_sec <= 0:
            raise ValueError("precision.report_timeout_sec must be > 0")
        if self.max_tokens < 1 or self.concurrency < 1:
            raise ValueError("precision.max_tokens and precision.concurrency must be >= 1")
        if self.enabled and not self.prompts:
            raise ValueError("precision.prompts must not be empty when precision.enabled")
