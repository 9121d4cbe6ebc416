"""Running top-N store: items ranked by a float64 score, with an optional capacity.

Guarantees: the order is total and deterministic (score, then serialized item bytes ascending among
equal scores, for both orders); the changelog is ``item -> (score, payload)`` with tombstones for
removed, popped and evicted items, so it is compactable; local state and changelog are only written
at :meth:`TopNEngine.flush` (one record per changed item since the previous flush).
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Iterator, NamedTuple

from sortedcontainers import SortedList

from localstate.core.changelog import ChangelogRecord
from localstate.core.engine import StoreContext
from localstate.engines.heap.base import HeapEngineBase
from localstate.engines.heap.codec import check_number, decode_score_value, encode_score_value
from localstate.errors import SerdeError

__all__ = ["Entry", "TopNEngine"]

log = logging.getLogger(__name__)

_ABSENT = object()


class Entry(NamedTuple):
    """One ranked entry: the item, its score (always a float) and its payload (None if none)."""

    item: Any
    score: float
    payload: Any


class TopNEngine(HeapEngineBase):
    """A ranked set of items (``engine = "heap"``, ``mode = "topn"``).

    In memory: ``dict item_bytes -> (score, payload_bytes)`` plus a ``SortedList`` of
    ``(sort_score, item_bytes)`` where ``sort_score`` is ``-score`` for ``order = "max"``, so the best
    entry is always at index 0. Persistence and changelog go through the inner key-value store.
    """

    def __init__(self, context: StoreContext) -> None:
        super().__init__(context)
        options = context.options
        self.order: str = options.get("order", "max")
        self.capacity: int | None = options.get("capacity")
        self._sign = -1.0 if self.order == "max" else 1.0
        self._entries: dict[bytes, tuple[float, bytes | None]] = {}
        self._dirty: dict[bytes, None] = {}  # insertion-ordered: deterministic changelog order
        self._sorted: SortedList = SortedList()
        self._load()

    def _load(self) -> None:
        """Rebuild the order from local state (no changelog replay)."""
        entries = self._entries
        with self._kv.all() as rows:
            for key, value in rows:
                try:
                    entries[bytes(key)] = decode_score_value(value)
                except ValueError as exc:
                    self._corrupt(None, f"local entry {bytes(key)[:32]!r}: {exc}")
        self._rebuild()
        if entries:
            log.debug("store %s/%d: loaded %d heap entries from local state", self.context.store,
                      self.context.partition, len(entries))

    def _rebuild(self) -> None:
        sign = self._sign
        self._sorted = SortedList([(sign * score, item) for item, (score, _) in self._entries.items()])

    def _drop_memory(self) -> None:
        self._entries = {}
        self._dirty = {}
        self._sorted = SortedList()

    # -- writes --------------------------------------------------------------------------------
    def push(self, item: Any, score: Any, payload: Any = None) -> Entry | None:
        """Insert ``item`` with ``score`` (re-pushing an item replaces its score and payload).

        Returns the entry evicted to respect ``capacity`` (possibly this very item), else None.
        Scores are float64: NaN raises InvalidValueError; +-inf are valid and rank at the ends.
        """
        if self._closed:
            self._check_open()
        try:
            key = self._kser(item)
        except SerdeError as exc:
            raise self._serde_error(exc, "item") from None
        if payload is None:
            data = None
        else:
            try:
                data = self._vser(payload)
            except SerdeError as exc:
                raise self._serde_error(exc, "payload") from None
        if type(score) is not float or score != score:
            score = self._score(score)
        entries = self._entries
        old = entries.get(key)
        if old is None:
            self._sorted.add((self._sign * score, key))
        elif old[0] != score:
            self._sorted.remove((self._sign * old[0], key))
            self._sorted.add((self._sign * score, key))
        entries[key] = (score, data)
        self._dirty[key] = None
        if self.capacity is not None and len(entries) > self.capacity:
            return self._evict()
        return None

    def _evict(self) -> Entry | None:
        evicted = None
        while len(self._entries) > self.capacity:  # type: ignore[operator]
            _, key = self._sorted.pop()
            score, data = self._entries.pop(key)
            self._dirty[key] = None
            evicted = self._entry(key, score, data)
        return evicted

    def push_all(self, entries: Iterable[tuple[Any, Any] | tuple[Any, Any, Any]]) -> list[Entry]:
        """Push ``(item, score)`` or ``(item, score, payload)`` tuples; returns the evicted entries."""
        evicted = []
        for entry in entries:
            out = self.push(*entry)
            if out is not None:
                evicted.append(out)
        return evicted

    def remove(self, item: Any) -> Entry | None:
        """Remove ``item``; returns its entry, or None if it was absent."""
        self._check_open()
        key = self._key(item)
        old = self._entries.pop(key, None)
        if old is None:
            return None
        self._sorted.remove((self._sign * old[0], key))
        self._dirty[key] = None
        return self._entry(key, old[0], old[1])

    def pop(self) -> Entry | None:
        """Remove and return the best entry (highest score for max, lowest for min); None when empty."""
        if self._closed:
            self._check_open()
        if not self._entries:
            return None
        _, key = self._sorted.pop(0)
        score, data = self._entries.pop(key)
        self._dirty[key] = None
        return self._entry(key, score, data)

    def pop_worst(self) -> Entry | None:
        """Remove and return the worst entry; None when empty."""
        self._check_open()
        if not self._entries:
            return None
        _, key = self._sorted.pop()
        score, data = self._entries.pop(key)
        self._dirty[key] = None
        return self._entry(key, score, data)

    def clear(self) -> None:
        """Remove every entry (each logged as a tombstone at the next flush)."""
        self._check_open()
        self._dirty.update(dict.fromkeys(self._entries))
        self._entries.clear()
        self._sorted.clear()

    # -- reads ---------------------------------------------------------------------------------
    def peek(self) -> Entry | None:
        """The best entry without removing it; None when empty."""
        self._check_open()
        if not self._entries:
            return None
        key = self._sorted[0][1]
        return self._entry(key, *self._entries[key])

    def score(self, item: Any) -> float | None:
        """The score of ``item``, or None when it is absent."""
        self._check_open()
        entry = self._entries.get(self._key(item))
        return None if entry is None else entry[0]

    def get(self, item: Any) -> Entry | None:
        """The entry of ``item``, or None when it is absent."""
        self._check_open()
        key = self._key(item)
        entry = self._entries.get(key)
        return None if entry is None else self._entry(key, *entry)

    def top(self, n: int) -> list[Entry]:
        """The ``n`` best entries, best first."""
        self._check_open()
        entries = self._entries
        return [self._entry(key, *entries[key]) for _, key in self._sorted.islice(0, max(n, 0))]

    def bottom(self, n: int) -> list[Entry]:
        """The ``n`` worst entries, worst first."""
        self._check_open()
        size = len(self._sorted)
        entries = self._entries
        return [self._entry(key, *entries[key])
                for _, key in self._sorted.islice(max(size - max(n, 0), 0), size, reverse=True)]

    def rank(self, item: Any) -> int | None:
        """0-based position of ``item`` in the order (0 = best), or None when absent."""
        self._check_open()
        key = self._key(item)
        entry = self._entries.get(key)
        return None if entry is None else self._sorted.index((self._sign * entry[0], key))

    def __len__(self) -> int:
        self._check_open()
        return len(self._entries)

    def __contains__(self, item: Any) -> bool:
        self._check_open()
        return self._key(item) in self._entries

    def __iter__(self) -> Iterator[Entry]:
        """Entries best first, from a snapshot taken when iteration starts."""
        self._check_open()
        entries = self._entries
        snapshot = [(key, entries[key]) for _, key in self._sorted]
        return (self._entry(key, score, data) for key, (score, data) in snapshot)

    # -- contract ------------------------------------------------------------------------------
    def flush(self) -> None:
        """Put every changed item (or its tombstone) into the inner store, then flush it (which logs,
        flushes the changelog and persists local state with the offset atomically)."""
        self._check_open()
        if self._dirty:
            entries = self._entries
            puts: list[tuple[bytes, bytes]] = []
            deletes: list[bytes] = []
            for key in self._dirty:
                entry = entries.get(key)
                if entry is None:
                    deletes.append(key)
                else:
                    puts.append((key, encode_score_value(entry[0], entry[1])))
            if puts:
                self._kv.put_all(puts)
            if deletes:
                self._kv.delete_all(deletes)
            self._dirty = {}
        self._kv.flush()

    def restore(self, records: Iterable[ChangelogRecord]) -> None:
        """Apply changelog records (last per item wins, tombstones delete) to the inner store and to
        the in-memory order; rebuilds the order in bulk when many items changed."""
        self._check_open()
        entries = self._entries
        before: dict[bytes, tuple[float, bytes | None] | object] = {}

        def tap() -> Iterator[ChangelogRecord]:
            for record in records:
                key = record.key
                if key not in before:
                    before[key] = entries.get(key, _ABSENT)
                if record.value is None:
                    entries.pop(key, None)
                else:
                    try:
                        entries[key] = decode_score_value(record.value)
                    except ValueError as exc:
                        self._corrupt(record, str(exc))
                yield record

        self._restore_into_kv(records, tap())
        if not before:
            return
        for key in before:  # the restored value is newer than any pending change
            self._dirty.pop(key, None)
        if len(before) * 8 >= len(self._sorted):
            self._rebuild()
            return
        sign, order = self._sign, self._sorted
        for key, old in before.items():
            if old is not _ABSENT:
                order.remove((sign * old[0], key))  # type: ignore[index]
            new = entries.get(key)
            if new is not None:
                order.add((sign * new[0], key))

    # -- helpers -------------------------------------------------------------------------------
    def _key(self, item: Any) -> bytes:
        try:
            return self._kser(item)
        except SerdeError as exc:
            raise self._serde_error(exc, "item") from None

    def _score(self, score: Any) -> float:
        try:
            return check_number(score)
        except (TypeError, ValueError, OverflowError) as exc:
            raise self._invalid(f"invalid score {score!r:.80}: {exc}",
                                "pass an int or float score; NaN is refused (+-inf are allowed)") from None

    def _entry(self, key: bytes, score: float, data: bytes | None) -> Entry:
        try:
            return Entry(self._kdes(key), score, None if data is None else self._vdes(data))
        except SerdeError as exc:
            raise self._serde_error(exc, "stored item or payload") from None
