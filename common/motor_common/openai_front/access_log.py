"""The access log: one structured line per request at the OpenAI front.

Logger ``motor.access`` at INFO, message ``request``, fields ``request_id`` (from the JSON
formatter), ``method``, ``route``, ``status``, ``latency_ms``, and for the inference routes
``model``, ``stream``, ``prompt_tokens``/``completion_tokens`` when the engine reported usage
(a JSON answer's ``usage``; a stream's usage chunk, sent when the client asked for
``stream_options.include_usage``). A request that never reached the handler (refused
connection) has no line; a client that went away is logged with status 499.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson

ACCESS_LOG = logging.getLogger("motor.access")

# Bytes of an SSE chunk searched for a usage object: the usage chunk is small, a long content
# chunk is not parsed for it.
_MAX_USAGE_CHUNK = 8192


@dataclass
class Access:
    """What the handlers learn about one request, for its access-log line."""

    model: str | None = None
    stream: bool | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def usage_from_json(self, data: bytes) -> None:
        """Token counts from a JSON answer's ``usage`` (left unset when absent or malformed)."""
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if isinstance(body, dict):
            self._take(body.get("usage"))

    def usage_from_sse(self, chunk: bytes) -> None:
        """Token counts from an SSE chunk carrying a ``usage`` object (the last one wins)."""
        if b'"usage"' not in chunk or len(chunk) > _MAX_USAGE_CHUNK:
            return
        for line in chunk.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if not payload.startswith(b"{"):
                continue
            try:
                event = orjson.loads(payload)
            except orjson.JSONDecodeError:
                continue
            if isinstance(event, dict):
                self._take(event.get("usage"))

    def _take(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int) and not isinstance(prompt, bool):
            self.prompt_tokens = prompt
        if isinstance(completion, int) and not isinstance(completion, bool):
            self.completion_tokens = completion


def log_access(method: str, route: str, status: int, latency_s: float, access: Access) -> None:
    """Write the request's access-log line (the request id comes from the logging context)."""
    if not ACCESS_LOG.isEnabledFor(logging.INFO):
        return
    fields: dict[str, Any] = {"method": method, "route": route, "status": status,
                              "latency_ms": round(latency_s * 1000.0, 3)}
    if access.model is not None:
        fields["model"] = access.model
        fields["stream"] = bool(access.stream)
    if access.prompt_tokens is not None:
        fields["prompt_tokens"] = access.prompt_tokens
    if access.completion_tokens is not None:
        fields["completion_tokens"] = access.completion_tokens
    ACCESS_LOG.info("request", extra=fields)
