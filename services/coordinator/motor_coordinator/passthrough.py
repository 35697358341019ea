"""Where a pass-through request goes (pure): the roles tried, in order, and the model it names.

A pass-through API (``request.PASSTHROUGH``) is relayed whole to one instance, never split
prefill→decode:

============  ===========================  ==================================================
api           roles, in order              why
============  ===========================  ==================================================
tokenize      union, prefill, decode       any engine of the model has its tokenizer; prefill
detokenize    union, prefill, decode       engines are the ones not holding long decodes
embeddings    union, prefill, decode       an embedding model is served whole (union); an
                                           engine that serves no embeddings answers 404 itself
responses     union, decode                a decode engine computes the prompt itself when no
                                           prefill hand-off is given (vLLM kv_both connectors)
responses_    union, decode                the engine that stored the response (response_homes.py:
retrieve,                                  remembered, else asked in turn); also a responses
responses_                                 request naming a previous_response_id
cancel
version       union, prefill, decode       any model: the first served model with an instance
============  ===========================  ==================================================

Within a role the scheduling policy picks, as for any request; an unreachable engine is replaced
by another of the same roles, at most ``dispatch.prefill_retries`` times.
"""

from __future__ import annotations

from collections.abc import Collection

from motor_common.domain import Role
from motor_common.errors import InvalidArgument
from motor_coordinator.request import RESPONSES, STORED_RESPONSE

_WHOLE = (Role.UNION, Role.PREFILL, Role.DECODE)
_GENERATE = (Role.UNION, Role.DECODE)


def roles(api: str) -> tuple[Role, ...]:
    """The roles that may serve *api*, preferred first."""
    return _GENERATE if api == RESPONSES or api in STORED_RESPONSE else _WHOLE


def resolve_model(named: str, served: Collection[str]) -> str:
    """The model a request is for: the one it names, else the fleet's only model (vLLM's default).
    An unknown named model is left to the scheduler (404 model_not_found)."""
    if named:
        return named
    if len(served) == 1:
        return next(iter(served))
    if not served:
        return ""
    raise InvalidArgument(
        f"'model' is required: this fleet serves {len(served)} models ({', '.join(sorted(served)[:5])}"
        f"{', …' if len(served) > 5 else ''})", reason="MISSING_MODEL", metadata={"param": "model"})
