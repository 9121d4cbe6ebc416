"""In-memory backend: a plain ``dict`` plus a sorted key index built only when a scan needs it.
Persists nothing: after a reopen it is empty and reports no local offset, so the runtime rebuilds it
from the changelog (small, logged in-memory state).

Point reads and writes are dict operations (the commit's bulk put is one ``dict.update``), so the
memory backend is the fastest one. Ordered access (range, prefix, full scans) goes through a sorted
list of the keys: built on the first scan, then kept up to date lazily -- writes made while it exists
only note the keys they add or remove, and the next scan merges them in (one sort of the new keys
plus a linear merge, since timsort merges two sorted runs in one pass).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from pathlib import Path
from typing import Any, Collection, Iterable, Mapping, Sequence

from localstate.core.backend import Item, KVBackend, has_deletes

__all__ = ["MemoryBackend"]


class MemoryBackend(KVBackend):
    """Ordered in-memory map; a write is applied in one step with no intervening reads or yields."""

    name = "memory"
    persistent = False
    sorted_writes = False  # a dict: key order buys nothing (the scan index sorts lazily)

    @classmethod
    def open(cls, directory: Path, options: Mapping[str, Any], *, store: str = "",
             partition: int | None = None) -> "MemoryBackend":
        """A fresh, empty map: nothing is read from or written to ``directory``."""
        return cls()

    def __init__(self) -> None:
        super().__init__()
        self._data: dict[bytes, bytes] = {}
        self._meta: dict[bytes, bytes] = {}
        self._index: list[bytes] | None = None   # sorted keys of _data, None until a scan needs them
        # Changes to the key set not yet merged into _index (only tracked while _index exists):
        # a key in _data is in _index unless it is in _added; a key not in _data is in _index iff
        # it is in _removed.
        self._added: set[bytes] = set()
        self._removed: set[bytes] = set()

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        get = self._data.get
        return [get(k) for k in keys]

    def get_meta(self, key: bytes) -> bytes | None:
        return self._meta.get(key)

    def approximate_count(self) -> int:
        return len(self._data)

    def _sorted_keys(self) -> list[bytes]:
        """The sorted key index, built or brought up to date."""
        index = self._index
        if index is None:
            index = self._index = sorted(self._data)
            self._added.clear()
            self._removed.clear()
            return index
        if self._removed:
            removed = self._removed
            index[:] = [k for k in index if k not in removed]
            removed.clear()
        if self._added:
            index.extend(sorted(self._added))
            index.sort()  # two sorted runs: timsort merges them in linear time
            self._added.clear()
        return index

    def _scan(self, start: bytes | None, end: bytes | None, after: bytes | None, reverse: bool,
              limit: int) -> list[tuple[bytes, bytes]]:
        index = self._sorted_keys()
        lo = 0 if start is None else bisect_left(index, start)
        hi = len(index) if end is None else bisect_left(index, end)
        if reverse:
            if after is not None:
                hi = min(hi, bisect_left(index, after))
            keys = index[max(lo, hi - limit):hi][::-1]
        else:
            if after is not None:
                lo = max(lo, bisect_right(index, after))
            keys = index[lo:min(hi, lo + limit)]
        data = self._data
        return [(k, data[k]) for k in keys]

    def _bulk_load(self, chunks: Iterable[Mapping[bytes, bytes | None]]) -> None:
        """Chunks merged into runs (:meth:`_runs`), each applied as one write. While no key index
        exists (a rebuild, before any scan) the first run into an empty map *becomes* the map and
        later runs are merged dict to dict: no per-key work in Python beyond dropping tombstones."""
        for run in self._runs(chunks):
            if self._index is not None:
                self._write(run.items(), {}, has_deletes(run))
                continue
            if self._data:
                self._data.update(run)  # dict to dict: no item tuples
            else:
                self._data = run
            if has_deletes(run):  # the run's tombstones are its keys' final state: drop them
                data = self._data
                for key in [k for k, v in run.items() if v is None]:
                    del data[key]

    def _write(self, items: Collection[Item], meta: Mapping[bytes, bytes], deletes: bool) -> None:
        data = self._data
        if self._index is not None:
            self._write_indexed(items)
        elif deletes:
            for key, value in items:
                if value is None:
                    data.pop(key, None)
                else:
                    data[key] = value
        elif items:
            data.update(items)
        self._meta.update(meta)

    def _write_indexed(self, items: Collection[Item]) -> None:
        """Apply ``items`` while a key index exists, noting the keys they add and remove."""
        data, added, removed = self._data, self._added, self._removed
        for key, value in items:
            if value is None:
                if key in data:
                    del data[key]
                    if key in added:
                        added.discard(key)   # never reached the index
                    else:
                        removed.add(key)
            else:
                if key not in data:
                    if key in removed:
                        removed.discard(key)  # still in the index
                    else:
                        added.add(key)
                data[key] = value

    def clear(self) -> None:
        self._data.clear()
        self._meta.clear()
        self._drop_index()

    def _drop_index(self) -> None:
        self._index = None
        self._added.clear()
        self._removed.clear()

    def _close(self) -> None:
        self._data = {}
        self._meta = {}
        self._drop_index()
