"""Precision (accuracy) alarms, decision logic only (SPEC §3.5): no I/O, no gRPC.

* :func:`probe_groups` — the P/D groups one probe round covers: every prefill x decode pair of one
  model and engine type the scheduler can form, and every union instance.
* :func:`classify` — one probe answer against the expected text → NORMAL / ABNORMAL / ERROR.
* :func:`learn_expected` — the expected answer of a prompt configured without one: the strict
  majority of the answers of one round.
* :class:`PrecisionTracker` — the per-group state machine (table below) and the alarm identity of
  each group: a CLEAR always carries the identity of its RAISE.

==========  ===========  ======================================  ===========
state       sample       next                                    emits
==========  ===========  ======================================  ===========
normal      NORMAL       normal                                  —
normal      ABNORMAL     alarmed (streak 0)                      RAISE
alarmed     ABNORMAL     alarmed (streak 0)                      —
alarmed     NORMAL       alarmed (streak+1), or normal at        CLEAR at
                         ``clear_threshold`` consecutive         threshold
any         ERROR        unchanged (not a sample: no answer)     —
alarmed     external     normal (controller cleared it)          —
==========  ===========  ======================================  ===========
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from motor_common.domain import EngineType, Instance, InstanceStatus, Role

Group = tuple[int, ...]  # (prefill id, decode id) or (union id,)


class Sample(enum.Enum):
    NORMAL = "normal"
    ABNORMAL = "abnormal"
    ERROR = "error"  # no comparable answer (unreachable, timeout, HTTP error): not a sample


class Action(enum.Enum):
    RAISE = "raise"
    CLEAR = "clear"


@dataclass(frozen=True)
class ProbeGroup:
    """A P/D group to probe: prefill + decode instances, or one union instance."""

    model: str
    engine: EngineType
    prefill: Instance | None = None
    decode: Instance | None = None
    union: Instance | None = None

    @property
    def ids(self) -> Group:
        if self.union is not None:
            return (self.union.id,)
        assert self.prefill is not None and self.decode is not None
        return (self.prefill.id, self.decode.id)


@dataclass(frozen=True)
class AlarmIdentity:
    """What the controller keys an alarm on (kind is always PRECISION): source + the group's ids."""

    source: str
    instance_ids: Group


@dataclass(frozen=True)
class AlarmEvent:
    action: Action
    identity: AlarmIdentity
    message: str


@dataclass(frozen=True)
class GroupState:
    alarmed: bool = False
    normal_streak: int = 0  # consecutive NORMAL samples while alarmed
    last: Sample | None = None


def probe_groups(instances: Iterable[Instance]) -> list[ProbeGroup]:
    """Every P x D pair (same model, same engine type) and every union instance, AVAILABLE only,
    in a stable order."""
    by_key: dict[tuple[str, EngineType, Role], list[Instance]] = {}
    for inst in sorted(instances, key=lambda i: i.id):
        if inst.status is InstanceStatus.AVAILABLE:
            by_key.setdefault((inst.model_name, inst.engine_type, inst.role), []).append(inst)
    out: list[ProbeGroup] = []
    for (model, engine, role), insts in sorted(by_key.items(), key=lambda kv: (kv[0][0], kv[0][1].value, kv[0][2].value)):
        if role is Role.UNION:
            out.extend(ProbeGroup(model, engine, union=u) for u in insts)
        elif role is Role.PREFILL:
            for p in insts:
                out.extend(ProbeGroup(model, engine, prefill=p, decode=d)
                           for d in by_key.get((model, engine, Role.DECODE), ()))
    return out


def normalize(text: str) -> str:
    """Whitespace-insensitive form of an answer (engines differ in leading spaces/newlines)."""
    return " ".join(text.split())


def classify(answer: str | None, expected: str | None) -> Sample:
    if answer is None or expected is None:
        return Sample.ERROR
    return Sample.NORMAL if normalize(answer) == normalize(expected) else Sample.ABNORMAL


def learn_expected(answers: Iterable[str | None]) -> str | None:
    """The answer given by a strict majority of the groups that answered, else None (try again
    next round). With one group its answer is the majority: configure ``expected`` when the
    fleet may already be wrong at start-up."""
    got = [normalize(a) for a in answers if a is not None]
    if not got:
        return None
    text, n = Counter(got).most_common(1)[0]
    return text if 2 * n > len(got) else None


def combine(samples: Sequence[Sample]) -> Sample:
    """One group's round over several prompts: any ABNORMAL → ABNORMAL; all NORMAL → NORMAL;
    otherwise ERROR (a prompt without an answer leaves the state as it is)."""
    if any(s is Sample.ABNORMAL for s in samples):
        return Sample.ABNORMAL
    if samples and all(s is Sample.NORMAL for s in samples):
        return Sample.NORMAL
    return Sample.ERROR


def step(state: GroupState, sample: Sample, clear_threshold: int) -> tuple[GroupState, Action | None]:
    """The table of the module docstring."""
    if sample is Sample.ERROR:
        return replace(state, last=sample), None
    if sample is Sample.ABNORMAL:
        return GroupState(alarmed=True, normal_streak=0, last=sample), (None if state.alarmed else Action.RAISE)
    if not state.alarmed:
        return GroupState(last=sample), None
    streak = state.normal_streak + 1
    if streak >= clear_threshold:
        return GroupState(last=sample), Action.CLEAR
    return GroupState(alarmed=True, normal_streak=streak, last=sample), None


def extract_text(api_chat: bool, body: Mapping[str, Any]) -> str | None:
    """The generated text of a non-streamed OpenAI answer (``choices[0]``), None if malformed."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    first = choices[0]
    if api_chat:
        msg = first.get("message")
        text = msg.get("content") if isinstance(msg, dict) else None
    else:
        text = first.get("text")
    return text if isinstance(text, str) else None


class PrecisionTracker:
    """Per-group alarm state and the events to report. ``source`` is ``coordinator@<address>``."""

    def __init__(self, source: str, clear_threshold: int) -> None:
        if clear_threshold < 1:
            raise ValueError("precision_clear_threshold must be >= 1")
        self.source = source
        self.clear_threshold = clear_threshold
        self._states: dict[Group, GroupState] = {}
        # group -> source of an alarm this tracker adopted (raised by an earlier coordinator): its
        # CLEAR must carry that identity
        self._adopted: dict[Group, str] = {}

    def identity(self, group: Group) -> AlarmIdentity:
        return AlarmIdentity(self._adopted.get(group, self.source), tuple(group))

    def adopt(self, group: Group, source: str) -> bool:
        """An alarm of *group* the controller holds active, raised by *source* (this coordinator
        before a restart, or another one before a failover): the group counts as alarmed, and
        ``clear_threshold`` normal samples clear that alarm, under its own identity. False (nothing
        changed) when the group is alarmed here already."""
        if self.state(group).alarmed:
            return False
        self._states[group] = GroupState(alarmed=True)
        self._adopted[group] = source
        return True

    def observe(self, group: Group, sample: Sample, detail: str = "") -> AlarmEvent | None:
        state, action = step(self._states.get(group, GroupState()), sample, self.clear_threshold)
        self._states[group] = state
        if action is None:
            return None
        if action is Action.RAISE:
            msg = f"precision probe answer differs from the expected text{': ' + detail if detail else ''}"
            self._adopted.pop(group, None)  # not alarmed before: a new alarm of this coordinator's
        else:
            msg = f"{self.clear_threshold} consecutive normal precision samples"
        event = AlarmEvent(action, self.identity(group), msg)
        if action is Action.CLEAR:
            self._adopted.pop(group, None)
        return event

    def state(self, group: Group) -> GroupState:
        return self._states.get(group, GroupState())

    def alarmed(self) -> frozenset[Group]:
        return frozenset(g for g, s in self._states.items() if s.alarmed)

    def groups(self) -> list[Group]:
        return sorted(self._states)

    def drop(self, instance_ids: Iterable[int]) -> list[Group]:
        """External clear (controller ``ClearPrecisionAlarms``): forget every alarmed group that
        contains one of *instance_ids* (all alarmed groups when empty). Nothing is reported."""
        ids = set(instance_ids)
        hit = [g for g, s in self._states.items() if s.alarmed and (not ids or ids.intersection(g))]
        for g in hit:
            self._states[g] = GroupState()
            self._adopted.pop(g, None)
        return sorted(hit)

    def retain(self, registered: Iterable[int]) -> list[Group]:
        """Forget groups one of whose instances left the registry (its alarm, if any, is the
        controller's to clear: terminate or auto-recovery). Returns the forgotten groups."""
        keep = set(registered)
        gone = [g for g in self._states if not keep.issuperset(g)]
        for g in gone:
            del self._states[g]
            self._adopted.pop(g, None)
        return sorted(gone)
