"""SGLang bootstrap hand-off: the same body, with the prefill's bootstrap address and a random
63-bit room, goes to prefill and decode at once; decode's answer is returned."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from motor_common.domain import Endpoint, EngineType, normalize_ip


def new_room() -> int:
    return random.getrandbits(63)


def inject_bootstrap(body: Mapping[str, Any], prefill: Endpoint, room: int) -> dict[str, Any]:
    """*body* with ``bootstrap_host``/``bootstrap_port``/``bootstrap_room`` of *prefill* (pure)."""
    out = dict(body)
    out["bootstrap_host"] = normalize_ip(prefill.ip)
    out["bootstrap_port"] = prefill.bootstrap_port
    out["bootstrap_room"] = room
    return out


class SGLangAdapter:
    engine = EngineType.SGLANG
    concurrent = True

    def __init__(self, rooms: Callable[[], int] = new_room) -> None:
        self._rooms = rooms

    def prefill_body(self, body: Mapping[str, Any], prefill: Endpoint) -> dict[str, Any]:
        return inject_bootstrap(body, prefill, self._rooms())

    def decode_body(
        self, body: Mapping[str, Any], prefill_body: Mapping[str, Any], prefill_reply: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        return dict(prefill_body)

    def handoff_failed(self, status: int, content_type: str, head: bytes) -> bool | None:
        return False  # concurrent hand-off: a failed prefill is seen on the prefill's own answer
