"""Scheduling around precision alarms, and the pinned route a probe takes (no I/O).

* :class:`PrecisionAwareScheduler` — the normal :class:`Scheduler`; when the route it chose is a
  P/D group (or union instance) with an active precision alarm and another schedulable group
  without one exists, the route is chosen again among the healthy groups with the same policy.
  With no healthy group left the alarmed route is kept: serving possibly wrong answers beats
  serving none, and the alarm is visible to operators (docs/precision.md). Prefill retries
  (``pick``) are not filtered.
* :class:`PinnedScheduler` — a scheduler whose only route is one group, so that a probe runs
  through the dispatcher's normal PD handoff (same adapters, same code) on exactly that pair;
  it has no other endpoint to retry on and no breakers, so probes never move endpoints in or
  out of rotation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from motor_common.domain import EngineType, Role
from motor_coordinator.policies import Candidate, Policy, RequestInfo
from motor_coordinator.precision import Group
from motor_coordinator.scheduler import EndpointKey, Route, Scheduler


def healthy_route(
    policy: Policy,
    req: RequestInfo,
    prefills: list[Candidate],
    decodes: list[Candidate],
    unions: list[Candidate],
    alarmed: frozenset[Group],
) -> Route | None:
    """A route avoiding *alarmed* groups (pure): P/D pairs of one engine type first, then union
    endpoints; None when every schedulable group is alarmed."""
    ok_prefills = [
        p for p in prefills
        if any(d.instance.engine_type is p.instance.engine_type
               and (p.instance.id, d.instance.id) not in alarmed for d in decodes)
    ]  # fmt: skip
    if ok_prefills:
        p = policy.select(Role.PREFILL, ok_prefills, req)
        ds = [d for d in decodes if d.instance.engine_type is p.instance.engine_type
              and (p.instance.id, d.instance.id) not in alarmed]  # fmt: skip
        return Route(p.instance.engine_type, prefill=p, decode=policy.select(Role.DECODE, ds, req))
    ok_unions = [u for u in unions if (u.instance.id,) not in alarmed]
    if ok_unions:
        u = policy.select(Role.UNION, ok_unions, req)
        return Route(u.instance.engine_type, union=u)
    return None


def route_group(route: Route) -> Group | None:
    if route.union is not None:
        return (route.union.instance.id,)
    if route.prefill is not None and route.decode is not None:
        return (route.prefill.instance.id, route.decode.instance.id)
    return None


class PrecisionAwareScheduler(Scheduler):
    _alarmed: frozenset[Group] = frozenset()
    # Called when the alarmed groups changed (the coordinator's front workers mirror them).
    on_alarmed: Callable[[], None] | None = None

    def set_alarmed(self, groups: frozenset[Group]) -> None:
        changed = groups != self._alarmed
        self._alarmed = groups
        if changed and self.on_alarmed is not None:
            self.on_alarmed()

    @property
    def alarmed(self) -> frozenset[Group]:
        return self._alarmed

    def route(self, req: RequestInfo) -> Route:
        chosen = super().route(req)
        if not self._alarmed or route_group(chosen) not in self._alarmed:
            return chosen
        model = req.model
        other = healthy_route(
            self.policy, req,
            self._candidates(model, Role.PREFILL), self._candidates(model, Role.DECODE),
            self._candidates(model, Role.UNION), self._alarmed,
        )  # fmt: skip
        return other if other is not None else chosen


class PinnedScheduler(Scheduler):
    """The one route of a probe (see the module docstring)."""

    def __init__(self, base: Scheduler, route: Route) -> None:
        super().__init__(base.policy)
        self._route = route

    def route(self, req: RequestInfo) -> Route:
        return self._route

    def pick(
        self,
        role: Role,
        req: RequestInfo,
        engine: EngineType | None = None,
        exclude: Iterable[EndpointKey] = (),
    ) -> Candidate | None:
        return None
