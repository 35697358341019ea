"""The Protocol an engine adapter implements: every engine-specific byte lives behind it.

The dispatcher only knows two hand-offs: ``concurrent=False`` (prefill, then decode with what the
prefill answered) and ``concurrent=True`` (both at once, decode's answer returned).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from motor_common.domain import Endpoint, EngineType


class EngineAdapter(Protocol):
    engine: EngineType
    concurrent: bool

    def prefill_body(self, body: Mapping[str, Any], prefill: Endpoint) -> dict[str, Any]:
        """The body sent to the prefill endpoint."""
        ...

    def decode_body(
        self, body: Mapping[str, Any], prefill_body: Mapping[str, Any], prefill_reply: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        """The body sent to the decode endpoint (*prefill_reply* is None for concurrent hand-offs)."""
        ...

    def handoff_failed(self, status: int, content_type: str, head: bytes) -> bool | None:
        """Does the decode's answer say the KV hand-off failed (so the pair may be run again before
        the client saw a byte)? *head*: a JSON answer's body or a stream's first bytes; None =
        read more of the stream. Asked only for sequential hand-offs."""
        ...
