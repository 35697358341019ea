"""Engine adapters, one per engine type."""

from __future__ import annotations

from motor_common.domain import EngineType
from motor_coordinator.adapters.base import EngineAdapter
from motor_coordinator.adapters.sglang import SGLangAdapter
from motor_coordinator.adapters.vllm import VllmAdapter


def default_adapters() -> dict[EngineType, EngineAdapter]:
    return {EngineType.VLLM: VllmAdapter(), EngineType.SGLANG: SGLangAdapter()}


__all__ = ["EngineAdapter", "SGLangAdapter", "VllmAdapter", "default_adapters"]
