"""Which instance holds a stored response (pure): vLLM keeps a ``store=true`` response in the
memory of the engine that created it, so ``GET /v1/responses/{id}``, its ``/cancel`` and a new
response naming it as ``previous_response_id`` must reach that engine; any other answers 404.

The coordinator remembers ``response id → instance`` when a ``/v1/responses`` answer passes
through it (:func:`response_id_of`: the ``id`` of a JSON answer, or the response id in the first
event of a stream), in a bounded memory (:class:`ResponseHomes`, least recently used first out).
An id it does not know (created before a restart, through another coordinator, or forgotten) is
asked of the instances that may hold it in turn (:func:`probe_order`: the remembered one first,
at most ``MAX_PROBES``), the first answer that is not a 404 wins.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import orjson

from motor_common.errors import InvalidArgument
from motor_common.openai_bounds import check_response_id

# remembered ids (an entry is ~150 bytes: ~10 MB at most)
MAX_REMEMBERED = 65536
# instances asked for an unknown id, at most
MAX_PROBES = 16
# bytes of a JSON answer read for its id / of a stream before its first event ends
MAX_JSON_BYTES = 8 * 2**20
MAX_FIRST_EVENT_BYTES = 1 * 2**20

_T = TypeVar("_T")
_K = TypeVar("_K")


class ResponseHomes(Generic[_K]):
    """A bounded memory of response id → the endpoint that stored it (each engine API server of a
    data-parallel instance has its own store); the least recently used id goes first."""

    def __init__(self, capacity: int = MAX_REMEMBERED) -> None:
        self.capacity = capacity
        self._homes: OrderedDict[str, _K] = OrderedDict()

    def __len__(self) -> int:
        return len(self._homes)

    def remember(self, response_id: str, home: _K) -> None:
        self._homes[response_id] = home
        self._homes.move_to_end(response_id)
        while len(self._homes) > self.capacity:
            self._homes.popitem(last=False)

    def home(self, response_id: str) -> _K | None:
        found = self._homes.get(response_id)
        if found is not None:
            self._homes.move_to_end(response_id)
        return found


def probe_order(candidates: Sequence[_T], keys: Sequence[_K], home: _K | None, limit: int = MAX_PROBES) -> list[_T]:
    """The candidates to ask, in order: the one whose key (``keys[i]``) is *home* first, then the
    others as given; at most *limit*."""
    first = [c for c, k in zip(candidates, keys, strict=True) if home is not None and k == home]
    rest = [c for c, k in zip(candidates, keys, strict=True) if home is None or k != home]
    return (first + rest)[:limit]


def response_id_of(content_type: str, head: bytes) -> str | None:
    """The response id in the start of a ``/v1/responses`` answer: the ``id`` of a JSON response
    object (*head* is the whole body), or of the ``response`` in a stream's first SSE event (*head*
    holds at least that event); None when it is not there or not a valid id."""
    if content_type.startswith("text/event-stream"):
        event, sep, _ = head.partition(b"\n\n")
        if not sep:
            return None
        data = b"".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))
        parsed = _json(data)
        obj = parsed.get("response") if isinstance(parsed, dict) else None
    else:
        obj = _json(head)
    rid = obj.get("id") if isinstance(obj, dict) else None
    try:
        return check_response_id(rid)
    except InvalidArgument:
        return None


def _json(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
