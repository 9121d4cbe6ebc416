"""The kv engine's bounded object cache: two generations of plain dicts.

A hit in the young generation costs one dict lookup (no LRU bookkeeping, unlike an OrderedDict's
``move_to_end``); a hit in the old generation moves the entry to the young one. When an insert finds
the cache full (``size`` entries), the old generation is dropped first (the entries not read since
it became old); if it is already empty, the young generation becomes the old one, less its
first-inserted half. So the cache holds at most ``size`` entries (bounded memory), a working set of
up to ``size`` keys ends up entirely in the young generation (one lookup per hit), and eviction
approximates LRU: on the shared Zipf(1.1) workload (1M events over 1M keys, 100k entries) it misses
156k times against an exact LRU's 140k (each miss one backend read); on the scattered one both miss
only on first touch.

Keys are whatever the engine uses as cache keys (canonical key objects or serialized keys); values
are the objects ``get`` returns (None: known absent).
"""

from __future__ import annotations

from itertools import islice
from typing import Any

__all__ = ["GenerationalCache"]

_MISS = object()


class GenerationalCache:
    """At most ``size`` entries in two disjoint generations (``young``, ``old``); see the module
    docstring.

    ``young`` and ``old`` keep their identity for the cache's lifetime (rotation moves entries, it
    does not rebind them), so the C hot path may hold them."""

    __slots__ = ("young", "old", "size")

    def __init__(self, size: int) -> None:
        self.young: dict[Any, Any] = {}
        self.old: dict[Any, Any] = {}
        #: most entries held; 0 disables the cache
        self.size = size

    def get(self, key: Any, default: Any = None) -> Any:
        """The cached value of ``key`` (moved to the young generation), else ``default``."""
        value = self.young.get(key, _MISS)
        if value is not _MISS:
            return value
        value = self.old.pop(key, _MISS)
        if value is _MISS:
            return default
        self.young[key] = value  # the entry moved: the count is unchanged
        return value

    def insert(self, key: Any, value: Any) -> None:
        """Cache ``value`` for ``key`` in the young generation, first evicting if the cache is full
        (see the module docstring)."""
        if self.size:
            young, old = self.young, self.old
            old.pop(key, None)  # one entry per key: the count stays exact
            if key not in young and len(young) + len(old) >= self.size:
                self.rotate()
            young[key] = value

    def insert_many(self, keys: list[Any], values: list[Any]) -> None:
        """:meth:`insert` of each pair, in order, for distinct keys in neither generation: one
        C-level update when they fit without an eviction, else one insert each."""
        if not self.size:
            return
        if len(self.young) + len(self.old) + len(keys) <= self.size:
            self.young.update(zip(keys, values))
            return
        insert = self.insert
        for key, value in zip(keys, values):
            insert(key, value)

    def rotate(self) -> None:
        """Evict: drop the old generation; when it is empty, the young generation becomes the old one
        and its first-inserted half is dropped. Rotations are rare (a few per ``size`` inserts, and
        inserts happen only on misses); the moves run in C but for the halving."""
        old = self.old
        if old:
            old.clear()
            return
        old.update(self.young)
        self.young.clear()
        for key in list(islice(old, len(old) // 2)):
            del old[key]

    def discard(self, key: Any) -> None:
        """Forget ``key`` in both generations."""
        self.young.pop(key, None)
        self.old.pop(key, None)

    def clear(self) -> None:
        """Forget every entry."""
        self.young.clear()
        self.old.clear()

    def __len__(self) -> int:
        return len(self.young) + len(self.old)

    def __contains__(self, key: object) -> bool:
        return key in self.young or key in self.old
