"""Parole of poison suspects (pure, no I/O): serve the victims of a hung engine, convict the poison.

When an engine hangs, the requests that were on it (the *suspects*, see ``liveness``) look the
same whether something outside froze the engine (SIGSTOP, a stuck driver) — then all of them are
innocent — or one of them hung it (a *poison request*): no observation of the hung engine tells
the two apart. Only sending a suspect to another engine does. So the suspects of one silence of
one engine (a *group*, keyed by the engine and its last sign of life) are **paroled one at a
time**: one member goes to another engine while the others wait.

* its retry answers (a first byte): it was innocent (*cleared*); the next member goes;
* its retry stalls too — it is the only suspect of its group on that other engine, and the
  second engine that hung under it: it is **convicted** (refused as poison, never sent to a third
  engine). That explains the group's engine's hang, so the other members go free (they are
  retried at once, as victims), and so does the hang of the engine it stalled last;
* its retry ends without a verdict (no other engine, the client went away): the next member goes.

A group is paroled through at most one engine at a time, so a poison request among many victims
costs one more engine, not one per victim, and no innocent member is convicted with it. The
dispatcher bounds how long a member waits for its turn.

The price, and why it is a choice (``dispatch.parole_suspects``): a real poison request hangs a
*second* engine before it is convicted. With parole off, every suspect is refused at once — a
poison reaches one engine only, and the requests a frozen engine was serving fail with it.
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from dataclasses import dataclass, field

from motor_coordinator.liveness import Key

GroupKey = tuple[Key, float]  # (engine, Liveness.episode)


class Turn(enum.Enum):
    WAIT = "wait"  # another member of its group is on parole
    PAROLE = "parole"  # may go to another engine; a stall there convicts it
    FREE = "free"  # a member of its group was convicted: it was a victim, retry it as innocent


@dataclass
class _Group:
    waiting: deque[int] = field(default_factory=deque)
    out: int | None = None  # the member on parole
    explained: bool = False  # a member was convicted (or the engine's hang explained otherwise)


class Quarantine:
    def __init__(self) -> None:
        self._groups: dict[GroupKey, _Group] = {}
        self._group_of: dict[int, GroupKey] = {}
        self._free: set[int] = set()
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        """Members not yet released (waiting or on parole)."""
        return len(self._group_of)

    def join(self, group: GroupKey) -> int:
        """A suspect of *group*'s engine: its ticket (ask :meth:`turn`)."""
        ticket = next(self._ids)
        g = self._groups.setdefault(group, _Group())
        self._group_of[ticket] = group
        if g.explained:
            self._free.add(ticket)
        elif g.out is None:
            g.out = ticket
        else:
            g.waiting.append(ticket)
        return ticket

    def group_of(self, ticket: int) -> GroupKey | None:
        return self._group_of.get(ticket)

    def turn(self, ticket: int) -> Turn:
        if ticket in self._free:
            return Turn.FREE
        group = self._group_of.get(ticket)
        if group is not None and self._groups[group].out == ticket:
            return Turn.PAROLE
        return Turn.WAIT

    def cleared(self, ticket: int) -> list[int]:
        """The member on parole was answered elsewhere, or gave up: the tickets whose turn came."""
        return self._release(ticket)

    def convicted(self, ticket: int) -> list[int]:
        """The member on parole stalled on a second engine: the rest of its group go free."""
        group = self._group_of.get(ticket)
        if group is None:
            return []
        self._groups[group].explained = True
        return self._release(ticket)

    def explain(self, group: GroupKey) -> list[int]:
        """*group*'s engine was hung by a convicted request: its waiting members go free."""
        g = self._groups.get(group)
        if g is None:
            g = self._groups[group] = _Group()
        g.explained = True
        return self._wake(group, g)

    def leave(self, ticket: int) -> list[int]:
        """A member is done (free and retried, or gave up waiting)."""
        return self._release(ticket)

    def _release(self, ticket: int) -> list[int]:
        self._free.discard(ticket)
        group = self._group_of.pop(ticket, None)
        if group is None:
            return []
        g = self._groups[group]
        if g.out == ticket:
            g.out = None
        else:
            try:
                g.waiting.remove(ticket)
            except ValueError:
                pass
        return self._wake(group, g)

    def _wake(self, group: GroupKey, g: _Group) -> list[int]:
        woken: list[int] = []
        if g.explained:
            while g.waiting:
                t = g.waiting.popleft()
                self._free.add(t)
                woken.append(t)
        elif g.out is None and g.waiting:
            g.out = g.waiting.popleft()
            woken.append(g.out)
        if g.out is None and not g.waiting and not any(self._group_of.get(t) == group for t in self._free):
            # nobody of the group is left: forget it (a late member starts a new group — with
            # the same key only if the engine stayed silent, and then it is judged afresh)
            del self._groups[group]
        return woken
