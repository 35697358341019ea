"""The scheduler's view: schedulable endpoints per model and role, their load and breakers.

No I/O. ``accept`` swaps in a new registry snapshot; ``route`` chooses (never mutates; it only
counts its decisions, ``motor_coordinator_policy_decisions_total``);
``load_guard`` does the in-flight accounting at dispatch time. Breaker and load updates come
from the dispatcher (request outcomes) and the monitor (probes, metrics scrapes).
"""

from __future__ import annotations

import heapq
import logging
import time
from bisect import bisect_left, insort
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar, cast

from motor_common.domain import Endpoint, EngineType, Instance, InstanceStatus, Role, normalize_ip
from motor_common.errors import NotFound, Unavailable
from motor_coordinator.breaker import Breaker
from motor_coordinator.liveness import Liveness
from motor_coordinator.metrics import POLICY_DECISIONS
from motor_coordinator.policies import Candidate, EngineLoad, Policy, RequestInfo
from motor_coordinator.policies.base import LiveSet, candidate_key, score
from motor_coordinator.registry import RegistryState

log = logging.getLogger(__name__)

EndpointKey = tuple[str, int]


@lru_cache(maxsize=1 << 16)
def _key(ip: str, port: int) -> EndpointKey:
    return (normalize_ip(ip), port)


def endpoint_key(ep: Endpoint) -> EndpointKey:
    return _key(ep.ip, ep.business_port)


_Entry = tuple[Instance, Endpoint, EndpointKey]
_T = TypeVar("_T")


class _Live:
    """The schedulable (available, breaker closed) endpoints of one (model, role) in index order,
    with a load index: score per position, positions per score (ascending), a lazy heap of scores.
    Rebuilt when the snapshot or a breaker changes; updated in O(log n) per load change. Policies'
    derived indexes (``memo``) live and die with it."""

    __slots__ = (
        "buckets", "engine", "entries", "heap", "in_heap", "memos", "model", "positions", "role", "scores",
    )

    def __init__(self, model: str, role: Role, entries: list[_Entry], scores: list[float]) -> None:
        self.model = model
        self.role = role
        self.entries = entries
        engines = {e[0].engine_type for e in entries}
        self.engine: EngineType | None = engines.pop() if len(engines) == 1 else None
        self.positions: dict[EndpointKey, list[int]] = {}
        self.scores = scores
        self.buckets: dict[float, list[int]] = {}
        for i, (_, _, k) in enumerate(entries):
            self.positions.setdefault(k, []).append(i)
            self.buckets.setdefault(scores[i], []).append(i)
        self.heap = list(self.buckets)
        heapq.heapify(self.heap)
        self.in_heap = set(self.heap)
        self.memos: dict[Callable[[LiveSet], object], object] = {}

    @property
    def size(self) -> int:
        return len(self.entries)

    def key_at(self, i: int) -> str:
        inst, ep, _ = self.entries[i]
        return candidate_key(inst, ep)

    def score_at(self, i: int) -> float:
        return self.scores[i]

    def memo(self, build: Callable[[LiveSet], _T]) -> _T:
        try:
            return cast(_T, self.memos[build])
        except KeyError:
            value = self.memos[build] = build(self)
            return value

    def tied(self) -> list[int]:
        heap, buckets = self.heap, self.buckets
        while heap[0] not in buckets:
            self.in_heap.discard(heapq.heappop(heap))
        return buckets[heap[0]]

    def update(self, key: EndpointKey, new: float) -> None:
        for i in self.positions.get(key, ()):
            old = self.scores[i]
            if old == new:
                continue
            self.scores[i] = new
            bucket = self.buckets[old]
            del bucket[bisect_left(bucket, i)]
            if not bucket:
                del self.buckets[old]
            target = self.buckets.get(new)
            if target is None:
                self.buckets[new] = [i]
                if new not in self.in_heap:
                    self.in_heap.add(new)
                    heapq.heappush(self.heap, new)
            else:
                insort(target, i)
        if len(self.heap) > 2 * len(self.buckets) + 32:  # drop stale scores
            self.heap = list(self.buckets)
            heapq.heapify(self.heap)
            self.in_heap = set(self.heap)


@dataclass(frozen=True)
class Route:
    """Where one request goes: a prefill+decode pair, or one union endpoint."""

    engine: EngineType
    prefill: Candidate | None = None
    decode: Candidate | None = None
    union: Candidate | None = None
    # Prompt tokens the prefill is expected to compute (policies with ``select_prefill``), queued
    # on its endpoint while it runs (``load_guard(..., tokens=)``).
    prefill_tokens: int = 0
    # No prefill is schedulable: the request goes whole to ``decode``, which computes the prompt
    # itself (vLLM only: ``scheduler.decode_only_fallback``).
    decode_only: bool = False
    # No decode is schedulable: the request goes whole to ``prefill``, which then decodes too
    # (vLLM only: ``scheduler.prefill_only_fallback``).
    prefill_only: bool = False


@dataclass(frozen=True)
class ProbeTarget:
    key: EndpointKey
    endpoint: Endpoint
    engine: EngineType


class Scheduler:
    def __init__(
        self,
        policy: Policy,
        *,
        breaker_failures: int = 3,
        breaker_cooldown: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        decode_only_fallback: bool = False,
        prefill_only_fallback: bool = False,
    ) -> None:
        self.policy = policy
        # vLLM: with no prefill schedulable for a model, send its requests whole to a decode
        # (which then computes the prompt itself) instead of refusing them; with no decode
        # schedulable, whole to a prefill (which then decodes too).
        self.decode_only_fallback = decode_only_fallback
        self.prefill_only_fallback = prefill_only_fallback
        # models served by one side alone now, and by which (log the transitions)
        self._alone: dict[str, Role] = {}
        self._failures = breaker_failures
        self._cooldown = breaker_cooldown
        self._clock = clock
        self._state = RegistryState()
        self._breakers: dict[EndpointKey, Breaker] = {}
        self._inflight: dict[EndpointKey, int] = {}
        self._queued_tokens: dict[EndpointKey, int] = {}  # Candidate.queued_tokens
        self._loads: dict[EndpointKey, EngineLoad] = {}
        # The other front workers' in-flight requests and queued prompt tokens per endpoint
        # (``http.workers`` > 1: load_board.py); counted in every load score and candidate.
        self._peer_inflight: dict[EndpointKey, int] = {}
        self._peer_tokens: dict[EndpointKey, int] = {}
        # Called with (endpoint, in flight, queued tokens) whenever this process's own count on an
        # endpoint changed (a front worker writes it on the load board).
        self.on_load_change: Callable[[EndpointKey, int, int], None] | None = None
        # Where the others' load is read (``refresh``): (force) -> the new sum, or None if unchanged.
        self.peer_source: Callable[[bool], Mapping[EndpointKey, tuple[int, int]] | None] | None = None
        self._listeners: list[Callable[[], None]] = []
        # Per-snapshot indexes (built in accept, read on every request): available endpoints per
        # (model, role) in (instance id, endpoint id) order, and registered instances per model.
        self._index: dict[tuple[str, Role], list[_Entry]] = {}
        self._by_model: dict[str, list[Instance]] = {}
        # Sub-linear routing (policies with select_index): live sets per (model, role), built on
        # first use after each snapshot/breaker change, kept current on in-flight/load changes.
        self._select_index = getattr(policy, "select_index", None)
        self._select_prefill = getattr(policy, "select_prefill", None)
        self._kv_weight: float = getattr(policy, "kv_usage_weight", 0.0)
        self._live: dict[tuple[str, Role], _Live] = {}
        self._live_of: dict[EndpointKey, list[_Live]] = {}
        # Signs of life per endpoint: which attempts stalled on a hung engine (liveness.py).
        self.liveness = Liveness(clock)
        self._decisions: dict[tuple[Role, str], Any] = {}

    def decided(self, role: Role, outcome: str) -> None:
        """Count one decision (``motor_coordinator_policy_decisions_total``); label children cached."""
        child = self._decisions.get((role, outcome))
        if child is None:
            child = self._decisions[(role, outcome)] = POLICY_DECISIONS.labels(self.policy.name, role.value, outcome)
        child.inc()

    # -- snapshot --------------------------------------------------------------------------

    def accept(self, state: RegistryState) -> None:
        """Swap in a new registry snapshot; breakers and loads of kept endpoints survive."""
        keys = {endpoint_key(ep) for inst in state.instances.values() for ep in inst.endpoints}
        self._breakers = {
            k: self._breakers.get(k) or Breaker(self._failures, self._cooldown) for k in keys
        }
        self._loads = {k: v for k, v in self._loads.items() if k in keys}
        self.liveness.forget(keys)
        index: dict[tuple[str, Role], list[_Entry]] = {}
        by_model: dict[str, list[Instance]] = {}
        for iid in sorted(state.instances):
            inst = state.instances[iid]
            by_model.setdefault(inst.model_name, []).append(inst)
            if inst.status is not InstanceStatus.AVAILABLE:
                continue
            entries = index.setdefault((inst.model_name, inst.role), [])
            for ep in sorted(inst.endpoints, key=lambda e: e.id):
                entries.append((inst, ep, endpoint_key(ep)))
        self._index = index
        self._by_model = by_model
        self._state = state
        self._changed()

    def subscribe(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def _changed(self) -> None:
        self._live = {}
        self._live_of = {}
        for listener in self._listeners:
            listener()

    # -- health, breakers, load --------------------------------------------------------------

    def clock(self) -> float:
        return self._clock()

    def is_broken(self, ep: Endpoint) -> bool:
        b = self._breakers.get(endpoint_key(ep))
        return b is not None and b.is_open

    def instance_unavailable(self, inst: Instance) -> bool:
        """All endpoints of *inst* are out of rotation (shown as UNAVAILABLE in List)."""
        return all(self.is_broken(ep) for ep in inst.endpoints)

    def record_failure(self, ep: Endpoint) -> None:
        b = self._breakers.get(endpoint_key(ep))
        if b is not None and b.record_failure(self._clock()):
            self._changed()

    def trip(self, ep: Endpoint) -> None:
        """Take *ep* out of rotation now (it hung); a passing probe after the cooldown restores it."""
        b = self._breakers.get(endpoint_key(ep))
        if b is not None and b.trip(self._clock()):
            self._changed()

    def record_success(self, ep: Endpoint) -> None:
        b = self._breakers.get(endpoint_key(ep))
        if b is not None:
            b.record_success()

    def record_probe(self, key: EndpointKey, ok: bool, sent_at: float | None = None) -> None:
        if key in self._breakers:
            if ok:
                self.liveness.alive(key)
            elif sent_at is not None:
                self.liveness.probe_failed(key, sent_at)
        b = self._breakers.get(key)
        if b is not None and b.record_probe(ok, self._clock()):
            self._changed()

    def set_load(self, key: EndpointKey, load: EngineLoad) -> None:
        if key in self._breakers:
            self._loads[key] = load
            self.liveness.alive(key)
            self._rescore(key)

    def _rescore(self, key: EndpointKey) -> None:
        lives = self._live_of.get(key)
        if lives:
            value = score(self._inflight.get(key, 0) + self._peer_inflight.get(key, 0), self._loads.get(key),
                          self._kv_weight)
            for live in lives:
                live.update(key, value)

    def inflight(self, ep: Endpoint) -> int:
        """Requests in flight on *ep*: this process's and the other front workers'."""
        k = endpoint_key(ep)
        return self._inflight.get(k, 0) + self._peer_inflight.get(k, 0)

    def queued_tokens(self, ep: Endpoint) -> int:
        k = endpoint_key(ep)
        return self._queued_tokens.get(k, 0) + self._peer_tokens.get(k, 0)

    def own_loads(self) -> dict[EndpointKey, tuple[int, int]]:
        """This process's own (in flight, queued prompt tokens) per endpoint with work on it."""
        tokens = self._queued_tokens
        return {k: (n, tokens.get(k, 0)) for k, n in self._inflight.items()}

    def refresh(self, force: bool = False) -> None:
        """Read the other front workers' load (``peer_source``) if it is due (or *force*)."""
        if self.peer_source is not None:
            loads = self.peer_source(force)
            if loads is not None:
                self.set_peer_loads(loads)

    def set_peer_loads(self, loads: Mapping[EndpointKey, tuple[int, int]]) -> None:
        """Replace the other front workers' load (in flight, queued prompt tokens) per endpoint;
        the endpoints whose figure changed are rescored."""
        inflight = {k: n for k, (n, _) in loads.items() if n > 0}
        tokens = {k: t for k, (_, t) in loads.items() if t > 0}
        changed = {k for k in inflight.keys() | self._peer_inflight.keys()
                   if inflight.get(k, 0) != self._peer_inflight.get(k, 0)}
        self._peer_inflight = inflight
        self._peer_tokens = tokens
        for k in changed:
            self._rescore(k)

    @asynccontextmanager
    async def load_guard(self, *candidates: Candidate | None, tokens: int = 0) -> AsyncIterator[None]:
        """Count a request in flight on each of *candidates* while the block runs; *tokens*
        (prompt tokens a prefill computes) are queued on each of them meanwhile."""
        keys = [endpoint_key(c.endpoint) for c in candidates if c is not None]
        tokens = max(0, tokens)
        for k in keys:
            self._inflight[k] = self._inflight.get(k, 0) + 1
            if tokens:
                self._queued_tokens[k] = self._queued_tokens.get(k, 0) + tokens
            self._rescore(k)
            if self.on_load_change is not None:
                self.on_load_change(k, self._inflight[k], self._queued_tokens.get(k, 0))
        try:
            yield
        finally:
            for k in keys:
                left = self._inflight.get(k, 0) - 1
                if left > 0:
                    self._inflight[k] = left
                else:
                    self._inflight.pop(k, None)
                if tokens:
                    queued = self._queued_tokens.get(k, 0) - tokens
                    if queued > 0:
                        self._queued_tokens[k] = queued
                    else:
                        self._queued_tokens.pop(k, None)
                self._rescore(k)
                if self.on_load_change is not None:
                    self.on_load_change(k, self._inflight.get(k, 0), self._queued_tokens.get(k, 0))

    def probe_targets(self) -> list[ProbeTarget]:
        seen: dict[EndpointKey, ProbeTarget] = {}
        for inst in self._state.instances.values():
            for ep in inst.endpoints:
                seen.setdefault(endpoint_key(ep), ProbeTarget(endpoint_key(ep), ep, inst.engine_type))
        return list(seen.values())

    # -- choosing ----------------------------------------------------------------------------

    @property
    def state(self) -> RegistryState:
        return self._state

    def _candidates(
        self, model: str, role: Role, engine: EngineType | None = None, exclude: Iterable[EndpointKey] = ()
    ) -> list[Candidate]:
        skip = set(exclude) if exclude else ()
        breakers = self._breakers
        inflight = self._inflight
        loads = self._loads
        queued = self._queued_tokens
        peer_n, peer_t = self._peer_inflight, self._peer_tokens
        out: list[Candidate] = []
        for inst, ep, k in self._index.get((model, role), ()):
            if engine is not None and inst.engine_type is not engine:
                continue
            if k in skip:
                continue
            b = breakers.get(k)
            if b is not None and b.is_open:
                continue
            out.append(Candidate(inst, ep, inflight.get(k, 0) + peer_n.get(k, 0), loads.get(k),
                                 queued.get(k, 0) + peer_t.get(k, 0)))
        return out

    def pick(
        self,
        role: Role,
        req: RequestInfo,
        engine: EngineType | None = None,
        exclude: Iterable[EndpointKey] = (),
    ) -> Candidate | None:
        if self.peer_source is not None:
            self.refresh()
        cands = self._candidates(req.model, role, engine, exclude)
        if not cands:
            self.decided(role, "no_candidate")
            return None
        self.decided(role, "retry_pick")
        return self.policy.select(role, cands, req)

    def pick_first(
        self, roles: Sequence[Role], req: RequestInfo, exclude: Iterable[EndpointKey] = (), *, count: bool = True,
    ) -> Candidate | None:
        """An endpoint of the first of *roles* (in order) that has a schedulable one (pass-through
        requests, ``passthrough.py``); counted as ``routed`` for that role, ``no_candidate`` for the
        last role when none has one (with *count*)."""
        if self.peer_source is not None:
            self.refresh()
        for role in roles:
            cands = self._candidates(req.model, role, None, exclude)
            if cands:
                if count:
                    self.decided(role, "routed")
                return self.policy.select(role, cands, req)
        if count and roles:
            self.decided(roles[-1], "no_candidate")
        return None

    def holders(self, roles: Sequence[Role], model: str | None = None) -> list[Candidate]:
        """Every schedulable endpoint of *roles* (in that order) of *model*, or of every model
        (*model* None), by model name then instance id; no decision is counted (the stored
        responses of ``response_homes.py`` are looked for on them in turn)."""
        models = [model] if model is not None else sorted(self._by_model)
        return [c for role in roles for m in models for c in self._candidates(m, role)]

    def _live_set(self, model: str, role: Role) -> _Live:
        live = self._live.get((model, role))
        if live is None:
            breakers, inflight, loads, w = self._breakers, self._inflight, self._loads, self._kv_weight
            entries = []
            for e in self._index.get((model, role), ()):
                b = breakers.get(e[2])
                if b is None or not b.is_open:
                    entries.append(e)
            peers = self._peer_inflight
            live = _Live(model, role, entries,
                         [score(inflight.get(k, 0) + peers.get(k, 0), loads.get(k), w) for _, _, k in entries])
            self._live[(model, role)] = live
            for k in live.positions:
                self._live_of.setdefault(k, []).append(live)
        return live

    def _candidate(self, live: _Live, i: int) -> Candidate:
        inst, ep, k = live.entries[i]
        return Candidate(inst, ep, self._inflight.get(k, 0) + self._peer_inflight.get(k, 0), self._loads.get(k),
                         self._queued_tokens.get(k, 0) + self._peer_tokens.get(k, 0))

    def _fast_route(self, req: RequestInfo) -> Route | None:
        """The P+D route of :meth:`route` without building candidates, when the policy can choose
        by index and the pair is unambiguous (one engine type on both sides); else None."""
        select = self._select_index
        if select is None:
            return None
        d = self._live_set(req.model, Role.DECODE)
        if not d.entries or d.engine is None:
            return None
        p = self._live_set(req.model, Role.PREFILL)
        if not p.entries or p.engine is not d.engine:
            return None
        pi = select(Role.PREFILL, p, req)
        if pi is None:
            return None
        di = select(Role.DECODE, d, req)
        if di is None:
            return None
        self.decided(Role.PREFILL, "routed")
        self.decided(Role.DECODE, "routed")
        if self._alone:
            self._pair_back(req.model)
        return Route(d.engine, prefill=self._candidate(p, pi), decode=self._candidate(d, di))

    def route(self, req: RequestInfo) -> Route:
        """Choose P+D (same engine type) when possible, else a union endpoint."""
        model = req.model
        registered = self._by_model.get(model)
        if not registered:
            raise NotFound(
                f"model {model!r} is not served by any registered instance",
                reason="MODEL_NOT_FOUND",
                metadata={"model": model},
            )
        if self.peer_source is not None:
            self.refresh()
        fast = self._fast_route(req)
        if fast is not None:
            return fast
        decodes = self._candidates(model, Role.DECODE)
        engines = {c.instance.engine_type for c in decodes}
        prefills = [c for c in self._candidates(model, Role.PREFILL) if c.instance.engine_type in engines]
        if prefills:
            self._pair_back(model)
            tokens = 0
            if self._select_prefill is not None:
                choice = self._select_prefill(prefills, req)
                p, tokens = choice.candidate, choice.tokens
            else:
                p = self.policy.select(Role.PREFILL, prefills, req)
            engine = p.instance.engine_type
            same = decodes if len(engines) == 1 else [c for c in decodes if c.instance.engine_type is engine]
            d = self.policy.select(Role.DECODE, same, req)
            self.decided(Role.PREFILL, "routed")
            self.decided(Role.DECODE, "routed")
            return Route(p.instance.engine_type, prefill=p, decode=d, prefill_tokens=tokens)
        unions = self._candidates(model, Role.UNION)
        if unions:
            u = self.policy.select(Role.UNION, unions, req)
            self.decided(Role.UNION, "routed")
            return Route(u.instance.engine_type, union=u)
        alone = self._decode_alone(model, decodes)
        if alone:
            d = self.policy.select(Role.DECODE, alone, req)
            self.decided(Role.PREFILL, "no_candidate")
            self.decided(Role.DECODE, "decode_only")
            return Route(EngineType.VLLM, decode=d, decode_only=True)
        alone = self._prefill_alone(model)
        if alone:
            p = self.policy.select(Role.PREFILL, alone, req)
            self.decided(Role.DECODE, "no_candidate")
            self.decided(Role.PREFILL, "prefill_only")
            return Route(EngineType.VLLM, prefill=p, prefill_only=True)
        roles = {i.role for i in registered}
        if Role.PREFILL in roles or Role.DECODE in roles:
            has_p = bool(self._candidates(model, Role.PREFILL))
            missing = [n for n, ok in (("prefill", has_p), ("decode", bool(decodes))) if not ok]
            for role, ok in ((Role.PREFILL, has_p), (Role.DECODE, bool(decodes))):
                if not ok:
                    self.decided(role, "no_candidate")
            what = " and ".join(missing) + " instance" if missing else "prefill+decode pair of one engine type"
            raise Unavailable(
                f"no schedulable {what} for model {model!r}",
                reason="NO_SCHEDULABLE_INSTANCE",
                metadata={"model": model, "role": "+".join(missing) or "pair"},
            )
        self.decided(Role.UNION, "no_candidate")
        raise Unavailable(
            f"no schedulable union instance for model {model!r}",
            reason="NO_SCHEDULABLE_INSTANCE",
            metadata={"model": model, "role": "union"},
        )

    def _decode_alone(self, model: str, decodes: list[Candidate]) -> list[Candidate]:
        """The decodes that may serve *model*'s requests whole while no prefill is schedulable
        (vLLM decodes, with ``decode_only_fallback``); logs when a model starts being served so."""
        if not self.decode_only_fallback:
            return []
        alone = [c for c in decodes if c.instance.engine_type is EngineType.VLLM]
        if alone:
            self._serving_alone(model, Role.DECODE)
        return alone

    def _prefill_alone(self, model: str) -> list[Candidate]:
        """The prefills that may serve *model*'s requests whole while no decode of theirs is
        schedulable (vLLM prefills, with ``prefill_only_fallback``: a vLLM kv_producer given no
        ``kv_transfer_params`` decodes like any vLLM); logs when a model starts being served so.
        Called only when no prefill has a schedulable decode of its engine type."""
        if not self.prefill_only_fallback:
            return []
        alone = [c for c in self._candidates(model, Role.PREFILL) if c.instance.engine_type is EngineType.VLLM]
        if alone:
            self._serving_alone(model, Role.PREFILL)
        return alone

    def _serving_alone(self, model: str, role: Role) -> None:
        if self._alone.get(model) is role:
            return
        self._alone[model] = role
        other, then = (("prefill", "computes the prompt itself") if role is Role.DECODE
                       else ("decode", "decodes them too"))
        log.warning("no %s is schedulable for model %r: its requests go whole to a %s instance, which %s, "
                    "until a %s is back", other, model, role.value, then, other)

    def _pair_back(self, model: str) -> None:
        role = self._alone.pop(model, None)
        if role is not None:
            log.info("a %s is schedulable again for model %r: prefill and decode are disaggregated again",
                     "prefill" if role is Role.DECODE else "decode", model)

    def has_schedulable_route(self) -> bool:
        """Some model has a schedulable P+D pair of one engine type, or a union endpoint, or (with
        ``decode_only_fallback`` / ``prefill_only_fallback``) a vLLM decode or prefill that can
        serve requests whole."""
        return any(self._serving(model) is not None for model in self._by_model)

    def served_alone(self) -> dict[str, Role]:
        """The models one side of the pair serves alone now (the fallbacks): model -> the role
        answering requests whole. Follows the registry and the breakers, not the requests."""
        out: dict[str, Role] = {}
        for model in self._by_model:
            how = self._serving(model)
            if isinstance(how, Role):
                out[model] = how
        return out

    def _serving(self, model: str) -> Role | str | None:
        """How *model* is served now: "routed" (a P+D pair of one engine type, or a union
        endpoint), the role serving it alone (a fallback), or None (refused)."""
        if self._candidates(model, Role.UNION):
            return "routed"
        decodes = self._candidates(model, Role.DECODE)
        prefills = self._candidates(model, Role.PREFILL)
        d_engines = {c.instance.engine_type for c in decodes}
        if any(c.instance.engine_type in d_engines for c in prefills):
            return "routed"
        if self.decode_only_fallback and any(c.instance.engine_type is EngineType.VLLM for c in decodes):
            return Role.DECODE
        if self.prefill_only_fallback and any(c.instance.engine_type is EngineType.VLLM for c in prefills):
            return Role.PREFILL
        return None

    def models(self) -> dict[str, Sequence[Instance]]:
        return {m: list(insts) for m, insts in self._by_model.items()}
