"""In-memory backend: a ``SortedDict``. Persists nothing: after a reopen it is empty and reports no
local offset, so the runtime rebuilds it from the changelog (small, logged in-memory state)."""

from __future__ import annotations

from itertools import islice
from pathlib import Path
from typing import Any, Collection, Iterable, Mapping, Sequence

from sortedcontainers import SortedDict

from localstate.core.backend import Item, KVBackend

__all__ = ["MemoryBackend"]


class MemoryBackend(KVBackend):
    """Ordered in-memory map; a write is applied in one step with no intervening reads or yields."""

    name = "memory"
    persistent = False
    sorted_writes = False  # the sorted dict orders (and bulk-sorts) what it is given

    @classmethod
    def open(cls, directory: Path, options: Mapping[str, Any], *, store: str = "",
             partition: int | None = None) -> "MemoryBackend":
        """A fresh, empty map: nothing is read from or written to ``directory``."""
        return cls()

    def __init__(self) -> None:
        super().__init__()
        self._data: SortedDict = SortedDict()
        self._meta: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        get = self._data.get
        return [get(k) for k in keys]

    def get_meta(self, key: bytes) -> bytes | None:
        return self._meta.get(key)

    def approximate_count(self) -> int:
        return len(self._data)

    def _scan(self, start: bytes | None, end: bytes | None, after: bytes | None, reverse: bool,
              limit: int) -> list[tuple[bytes, bytes]]:
        data = self._data
        if reverse:
            hi, hi_inc = (after, False) if after is not None and (end is None or after < end) else (end, False)
            keys = data.irange(start, hi, inclusive=(True, hi_inc), reverse=True)
        else:
            lo, lo_inc = (after, False) if after is not None and (start is None or after >= start) else (start, True)
            keys = data.irange(lo, end, inclusive=(lo_inc, False))
        return [(k, data[k]) for k in islice(keys, limit)]

    def _bulk_load(self, chunks: Iterable[Mapping[bytes, bytes | None]]) -> None:
        """Chunks merged into runs (:meth:`_runs`): a run of at least a tenth of the store's size is
        merged by one sort in C (``SortedDict.update``) instead of one bisect insert per key."""
        for run in self._runs(chunks):
            if None in run.values():
                self._write(run.items(), {}, True)
            else:
                self._data.update(run)

    def _write(self, items: Collection[Item], meta: Mapping[bytes, bytes], deletes: bool) -> None:
        data = self._data
        if deletes:
            for key, value in items:
                if value is None:
                    data.pop(key, None)
                else:
                    data[key] = value
        elif items:
            data.update(items)
        self._meta.update(meta)

    def clear(self) -> None:
        self._data.clear()
        self._meta.clear()

    def _close(self) -> None:
        self._data = SortedDict()
        self._meta = {}
