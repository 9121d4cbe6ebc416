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
from localstate.engines.heap.codec import SCORE_HEADER, check_number, decode_score_value, encode_score_value
from localstate.errors import SerdeError

__all__ = ["Entry", "TopNEngine"]

log = logging.getLogger(__name__)

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
        # Scores and payloads live in two flat dicts (floats and bytes are not tracked by the garbage
        # collector; a tuple per entry would make every collection walk the whole heap).
        self._scores: dict[bytes, float] = {}
        self._payloads: dict[bytes, bytes] = {}
        # Changed items since the last flush -> whether the item exists in the flushed state (if it
        # does not, removing it again needs no tombstone). Insertion-ordered: deterministic changelog.
        self._dirty: dict[bytes, bool] = {}
        self._sorted: SortedList = SortedList()
        self._load()

    def _load(self) -> None:
        """Rebuild the order from local state (no changelog replay)."""
        scores, payloads = self._scores, self._payloads
        with self._kv.all() as rows:
            for key, value in rows:
                key = bytes(key)
                try:
                    score, data = decode_score_value(value)
                except ValueError as exc:
                    self._corrupt(None, f"local entry {key[:32]!r}: {exc}")
                scores[key] = score
                if data is not None:
                    payloads[key] = data
        self._rebuild()
        if scores:
            log.debug("store %s/%d: loaded %d heap entries from local state", self.context.store,
                      self.context.partition, len(scores))

    def _rebuild(self) -> None:
        sign = self._sign
        self._sorted = SortedList([(sign * score, item) for item, score in self._scores.items()])

    def _drop_memory(self) -> None:
        self._scores = {}
        self._payloads = {}
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
        if payload is not None:
            try:
                data = self._vser(payload)
            except SerdeError as exc:
                raise self._serde_error(exc, "payload") from None
        if type(score) is not float or score != score:
            score = self._score(score)
        scores = self._scores
        old = scores.get(key)
        if old is None:
            self._sorted.add((self._sign * score, key))
        elif old != score:
            self._sorted.remove((self._sign * old, key))
            self._sorted.add((self._sign * score, key))
        scores[key] = score
        if payload is not None:
            self._payloads[key] = data
        elif self._payloads:
            self._payloads.pop(key, None)
        dirty = self._dirty
        if key not in dirty:
            dirty[key] = old is not None
        if self.capacity is not None and len(scores) > self.capacity:
            return self._evict()
        return None

    def _evict(self) -> Entry | None:
        evicted = None
        while len(self._scores) > self.capacity:  # type: ignore[operator]
            evicted = self._take(self._sorted.pop()[1])
        return evicted

    def _take(self, key: bytes) -> Entry:
        """Forget ``key`` (already removed from the order) and return its entry."""
        score = self._scores.pop(key)
        data = self._payloads.pop(key, None) if self._payloads else None
        dirty = self._dirty
        if key not in dirty:
            dirty[key] = True
        try:
            return Entry(self._kdes(key), score, None if data is None else self._vdes(data))
        except SerdeError as exc:
            raise self._serde_error(exc, "stored item or payload") from None

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
        old = self._scores.get(key)
        if old is None:
            return None
        self._sorted.remove((self._sign * old, key))
        return self._take(key)

    def pop(self) -> Entry | None:
        """Remove and return the best entry (highest score for max, lowest for min); None when empty."""
        if self._closed:
            self._check_open()
        if not self._scores:
            return None
        return self._take(self._sorted.pop(0)[1])

    def pop_worst(self) -> Entry | None:
        """Remove and return the worst entry; None when empty."""
        self._check_open()
        if not self._scores:
            return None
        return self._take(self._sorted.pop()[1])

    def clear(self) -> None:
        """Remove every entry (each logged as a tombstone at the next flush)."""
        self._check_open()
        dirty = self._dirty
        for key in self._scores:
            if key not in dirty:
                dirty[key] = True
        self._scores.clear()
        self._payloads.clear()
        self._sorted.clear()

    # -- reads ---------------------------------------------------------------------------------
    def peek(self) -> Entry | None:
        """The best entry without removing it; None when empty."""
        self._check_open()
        if not self._scores:
            return None
        return self._entry(self._sorted[0][1])

    def score(self, item: Any) -> float | None:
        """The score of ``item``, or None when it is absent."""
        self._check_open()
        return self._scores.get(self._key(item))

    def get(self, item: Any) -> Entry | None:
        """The entry of ``item``, or None when it is absent."""
        self._check_open()
        key = self._key(item)
        return self._entry(key) if key in self._scores else None

    def top(self, n: int) -> list[Entry]:
        """The ``n`` best entries, best first."""
        self._check_open()
        return [self._entry(key) for _, key in self._sorted.islice(0, max(n, 0))]

    def bottom(self, n: int) -> list[Entry]:
        """The ``n`` worst entries, worst first."""
        self._check_open()
        size = len(self._sorted)
        return [self._entry(key) for _, key in self._sorted.islice(max(size - max(n, 0), 0), size, reverse=True)]

    def rank(self, item: Any) -> int | None:
        """0-based position of ``item`` in the order (0 = best), or None when absent."""
        self._check_open()
        key = self._key(item)
        score = self._scores.get(key)
        return None if score is None else self._sorted.index((self._sign * score, key))

    def __len__(self) -> int:
        self._check_open()
        return len(self._scores)

    def __contains__(self, item: Any) -> bool:
        self._check_open()
        return self._key(item) in self._scores

    def __iter__(self) -> Iterator[Entry]:
        """Entries best first, from a snapshot taken when iteration starts."""
        self._check_open()
        scores, payloads = self._scores, self._payloads
        snapshot = [(key, scores[key], payloads.get(key)) for _, key in self._sorted]
        return (self._make(key, score, data) for key, score, data in snapshot)

    # -- contract ------------------------------------------------------------------------------
    def flush(self) -> None:
        """Put every changed item (or its tombstone) into the inner store, then flush it (which logs,
        flushes the changelog and persists local state with the offset atomically)."""
        self._check_open()
        if self._dirty:
            scores, payloads = self._scores, self._payloads
            puts: list[tuple[bytes, bytes]] = []
            deletes: list[bytes] = []
            for key, existed in self._dirty.items():
                score = scores.get(key)
                if score is not None:
                    puts.append((key, encode_score_value(score, payloads.get(key))))
                elif existed:  # an item created and removed since the last flush needs no record
                    deletes.append(key)
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
        scores, payloads = self._scores, self._payloads
        before: dict[bytes, float | None] = {}
        # An empty store with no pending changes is rebuilt in bulk afterwards: nothing to remember.
        track = bool(scores) or bool(self._dirty)
        applied = [0]
        header = SCORE_HEADER.size
        unpack = SCORE_HEADER.unpack_from

        def tap() -> Iterator[ChangelogRecord]:
            for record in records:
                key, value = record.key, record.value
                if track and key not in before:
                    before[key] = scores.get(key)
                if value is None:
                    scores.pop(key, None)
                    payloads.pop(key, None)
                    applied[0] += 1
                    yield record
                    continue
                if len(value) == header:  # fast path: no payload
                    score, flag = unpack(value)
                    if flag or score != score:
                        self._corrupt(record, "bad score header")
                    data = None
                else:
                    try:
                        score, data = decode_score_value(value)
                    except ValueError as exc:
                        self._corrupt(record, str(exc))
                scores[key] = score
                if data is None:
                    if payloads:
                        payloads.pop(key, None)
                else:
                    payloads[key] = data
                applied[0] += 1
                yield record

        try:
            self._restore_into_kv(records, tap())
        except BaseException:
            self._rebuild()  # keep the order consistent with what was applied before the failure
            raise
        if not track:
            if applied[0]:
                self._rebuild()
            return
        if not before:
            return
        for key in before:  # the restored value is newer than any pending change
            self._dirty.pop(key, None)
        if len(before) * 8 >= len(self._sorted):
            self._rebuild()
            return
        sign, order = self._sign, self._sorted
        for key, old in before.items():
            if old is not None:
                order.remove((sign * old, key))
            new = scores.get(key)
            if new is not None:
                order.add((sign * new, key))

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

    def _entry(self, key: bytes) -> Entry:
        return self._make(key, self._scores[key], self._payloads.get(key))

    def _make(self, key: bytes, score: float, data: bytes | None) -> Entry:
        try:
            return Entry(self._kdes(key), score, None if data is None else self._vdes(data))
        except SerdeError as exc:
            raise self._serde_error(exc, "stored item or payload") from None
