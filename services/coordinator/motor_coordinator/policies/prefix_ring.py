"""A consistent-hash ring over endpoint keys, for prefix_aware (pure, no I/O).

Every key owns :data:`VNODES` points on a 64-bit circle (blake2b of the key); a prompt prefix
hashes to one point (blake2b, 8 bytes) and belongs to the key owning the first point clockwise
from it. Finding it is a bisect: O(log(keys x VNODES)).

The owner is a function of the key *set* only, not of its order nor of the ring that answers: a
ring built over a superset answers for a subset by walking clockwise past points of non-members
(:meth:`RingView.choose`). Hence removing a key moves only the prefixes it owned, and a ring
survives endpoint churn: a set that lost members (a breaker opened, a retry excludes the endpoint
that failed) is a view of the ring it had; a set that gained members extends that ring (one merge)
instead of hashing every key again. (Two keys drawing the same 64-bit point — odds about
keys² x VNODES² / 2^65 — would order by the ring's own key order.)
"""

from __future__ import annotations

import hashlib
import struct
from bisect import bisect_right
from collections.abc import Hashable, Sequence

# Points per key: the keys' shares of the circle spread by about 1/sqrt(VNODES) (relative).
VNODES = 128
_PER_DIGEST = 8  # one 64-byte blake2b digest = 8 points
_UNPACK = struct.Struct(f">{_PER_DIGEST}Q").unpack
# A ring entry is one int, point << _ID_BITS | key id: one sort, one bisect, no parallel arrays.
_ID_BITS = 24
_ID_MASK = (1 << _ID_BITS) - 1


def prefix_point(prefix: str) -> int:
    """Where *prefix* falls on the circle."""
    return int.from_bytes(hashlib.blake2b(prefix.encode(), digest_size=8).digest(), "big")


def key_points(key: str, vnodes: int = VNODES) -> list[int]:
    """The points *key* owns (deterministic, independent of the other keys)."""
    out: list[int] = []
    for block in range(-(-vnodes // _PER_DIGEST)):
        out.extend(_UNPACK(hashlib.blake2b(f"{key}\x00{block}".encode(), digest_size=64).digest()))
    return out[:vnodes]


class HashRing:
    """The points of distinct keys, sorted. *base*: a ring whose keys and points are reused
    (this ring holds its keys plus the new ones in *keys*)."""

    __slots__ = ("entries", "index", "keys", "vnodes")

    def __init__(self, keys: Sequence[str], vnodes: int = VNODES, base: HashRing | None = None) -> None:
        self.vnodes = vnodes
        self.keys: list[str] = [] if base is None else list(base.keys)
        self.index: dict[str, int] = {} if base is None else dict(base.index)
        fresh: list[int] = []
        for k in keys:
            if k not in self.index:
                kid = self.index[k] = len(self.keys)
                self.keys.append(k)
                fresh.extend(p << _ID_BITS | kid for p in key_points(k, vnodes))
        if not self.keys:
            raise ValueError("a hash ring needs at least one key")
        if len(self.keys) > _ID_MASK:
            raise ValueError(f"a hash ring holds at most {_ID_MASK} keys")
        # Over a base: one long sorted run plus a short one, which sorted() merges in linear time.
        self.entries: list[int] = sorted(fresh if base is None else base.entries + fresh)

    @property
    def size(self) -> int:
        return len(self.keys)

    def start(self, point: int) -> int:
        """Index of the first entry clockwise from *point* (past it, wrapping around)."""
        i = bisect_right(self.entries, point << _ID_BITS | _ID_MASK)
        return 0 if i == len(self.entries) else i

    def owner(self, point: int) -> str:
        """The key owning *point*."""
        return self.keys[self.entries[self.start(point)] & _ID_MASK]

    def view(self, keys: Sequence[str]) -> RingView | None:
        """This ring answering for *keys* (positions in *keys*; a key listed twice answers with its
        first position), or None when one of them is not on it."""
        local = [-1] * len(self.keys)
        index = self.index
        for i, k in enumerate(keys):
            kid = index.get(k)
            if kid is None:
                return None
            if local[kid] < 0:
                local[kid] = i
        return RingView(self, local)


class RingView:
    """A ring answering for an endpoint set whose keys are all on it: ``local[key id]`` is the
    key's position in the set, -1 for a key that is not a member."""

    __slots__ = ("local", "ring")

    def __init__(self, ring: HashRing, local: list[int]) -> None:
        self.ring = ring
        self.local = local

    def choose(self, point: int) -> int:
        """Position in the set of the member owning *point*."""
        entries, local = self.ring.entries, self.local
        n = len(entries)
        i = self.ring.start(point)
        for _ in range(n):
            pos = local[entries[i] & _ID_MASK]
            if pos >= 0:
                return pos
            i = i + 1 if i + 1 < n else 0
        raise ValueError("no member of the endpoint set is on this ring")


class RingCache:
    """Rings per lineage (a scheduler's (model, role)), at most *limit* each, most recent first.
    A ring answers for a set when it holds every key of the set and no more than twice as many
    (so a walk past non-members stays short); else the first ring that would after adding the
    set's new keys is extended; else a ring is built from the set."""

    __slots__ = ("_rings", "limit", "vnodes")

    def __init__(self, limit: int = 3, vnodes: int = VNODES) -> None:
        self._rings: dict[Hashable, list[HashRing]] = {}
        self.limit = limit
        self.vnodes = vnodes

    def view(self, lineage: Hashable, keys: Sequence[str]) -> RingView:
        rings = self._rings.setdefault(lineage, [])
        bound = 2 * len(keys)
        for n, ring in enumerate(rings):
            if ring.size <= bound:
                found = ring.view(keys)
                if found is not None:
                    if n:
                        rings.insert(0, rings.pop(n))
                    return found
        for n, ring in enumerate(rings):
            missing = sum(1 for k in keys if k not in ring.index)
            if ring.size + missing <= bound:
                ring = HashRing(keys, self.vnodes, base=ring)
                rings[n : n + 1] = []  # the extension replaces its base
                break
        else:
            ring = HashRing(keys, self.vnodes)
        rings.insert(0, ring)
        del rings[self.limit :]
        view = ring.view(keys)
        assert view is not None
        return view
