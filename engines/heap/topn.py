"""Running top-N store: items ranked by a float64 score, with an optional capacity.

Guarantees: the order is total and deterministic (score, then serialized item bytes ascending among
equal scores, for both orders); the changelog is ``item -> (score, payload)`` with tombstones for
removed, popped and evicted items, so it is compactable; local state and changelog are only written
at :meth:`TopNEngine.flush` (one record per changed item since the previous flush).

Performance: the order is maintained lazily. A push only records the item as *unplaced*; the next
call that reads the order (pop, peek, top, rank, iteration, a capacity eviction) places every
unplaced item at once (``SortedList.update``: a bulk sort when there are many). An item updated many
times between two reads is placed once, and a burst of pushes costs one sort instead of one
insertion each. The result of every call is the same as with an always-sorted list.
"""

from __future__ import annotations

import logging
import math
from operator import itemgetter
from typing import Any, Iterable, Iterator, NamedTuple

from sortedcontainers import SortedList

from localstate.core.changelog import ChangelogRecord
from localstate.core.codecs import FAST_ERRORS
from localstate.core.engine import StoreContext
from localstate.engines.heap.base import HeapEngineBase
from localstate.engines.heap.codec import SCORE_HEADER, check_number, decode_score_value
from localstate.errors import InvalidValueError


__all__ = ["Entry", "TopNEngine"]

log = logging.getLogger(__name__)


_new_entry = tuple.__new__  # Entry(...) through a C call: NamedTuple's __new__ is a Python function


class Entry(NamedTuple):
    """One ranked entry: the item, its score (always a float) and its payload (None if none)."""

    item: Any
    score: float
    payload: Any


class TopNEngine(HeapEngineBase):
    """A ranked set of items (``engine = "heap"``, ``kind = "topn"``).

    In memory: dicts ``item_bytes -> score`` and ``item_bytes -> payload_bytes``, a ``SortedList`` of
    ``(sort_score, item_bytes)`` where ``sort_score`` is ``-score`` for ``order = "max"`` (so the best
    entry is at index 0), and the *unplaced* items (``item_bytes -> sort_score``, pushed since the
    order was last read). Invariant: every item is either unplaced (under its current score) or in
    the SortedList under its current score, never both. Changed items are written to the
    changelog and the local backend at :meth:`flush` only (see :mod:`localstate.engines.heap.base`).
    """

    kind = "topn"

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
        # Items not in _sorted yet -> their sort score (placed by _place() before the order is read).
        self._unplaced: dict[bytes, float] = {}
        self._load()

    def _load(self) -> None:
        """Rebuild the order from local state (no changelog replay)."""
        rows = self._local_rows()
        if rows and not self._load_plain(rows):
            scores, payloads = self._scores, self._payloads
            for key, value in rows.items():
                try:
                    score, data = decode_score_value(value)
                except ValueError as exc:
                    self._corrupt(None, f"local entry {key[:32]!r}: {exc}")
                scores[key] = score
                if data is not None:
                    payloads[key] = data
        self._rebuild()
        if self._scores:
            log.debug("store %s/%d: loaded %d heap entries from local state", self.context.store,
                      self.context.partition, len(self._scores))

    def _load_plain(self, rows: dict[bytes, bytes]) -> bool:
        """Fast path of :meth:`_load` when no entry has a payload: decode every score in one
        ``iter_unpack`` over the joined values. Returns False (nothing loaded) otherwise."""
        values = list(rows.values())
        if set(map(len, values)) != {SCORE_HEADER.size}:
            return False
        decoded = list(SCORE_HEADER.iter_unpack(b"".join(values)))
        scores = list(map(itemgetter(0), decoded))
        if any(map(itemgetter(1), decoded)) or any(map(math.isnan, scores)):
            return False  # flags or NaN: let the general path report the bad entry
        self._scores = dict(zip(rows, scores))
        return True

    def _rebuild(self) -> None:
        sign = self._sign
        self._sorted = SortedList([(sign * score, item) for item, score in self._scores.items()])
        self._unplaced = {}

    def _place(self) -> None:
        """Put every unplaced item into the order (call before reading the order)."""
        self._sorted.update([(sort_score, key) for key, sort_score in self._unplaced.items()])
        self._unplaced = {}

    def _live_count(self) -> int:
        return len(self._scores)

    def _snapshot(self) -> list[tuple[bytes, bytes]]:
        pack, payloads = SCORE_HEADER.pack, self._payloads
        if not payloads:
            return [(key, pack(score, 0)) for key, score in self._scores.items()]
        return [(key, (pack(score, 1) + payloads[key]) if key in payloads else pack(score, 0))
                for key, score in self._scores.items()]

    def _drop_memory(self) -> None:
        self._scores = {}
        self._payloads = {}
        self._dirty = {}
        self._sorted = SortedList()
        self._unplaced = {}

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
        except FAST_ERRORS:
            key = self._slow(self.context.key_serde.serialize, item, "item")
        if payload is not None:
            try:
                data = self._vser(payload)
            except FAST_ERRORS:
                data = self._slow(self.context.value_serde.serialize, payload, "payload")
        if type(score) is not float or score != score:
            score = self._score(score)
        scores = self._scores
        old = scores.get(key)
        if old is not None and old != score and key not in self._unplaced:
            self._sorted.remove((self._sign * old, key))  # placed under its old score: unplace it
        if old != score:
            self._unplaced[key] = self._sign * score
        scores[key] = score
        if payload is not None:
            self._payloads[key] = data
        elif self._payloads:
            self._payloads.pop(key, None)
        self._dirty.setdefault(key, old is not None)  # first change since the flush decides
        if self.capacity is not None and len(scores) > self.capacity:
            return self._evict()
        return None

    def _evict(self) -> Entry | None:
        if self._unplaced:
            self._place()
        evicted = None
        while len(self._scores) > self.capacity:  # type: ignore[operator]
            evicted = self._take(self._sorted.pop()[1])
        return evicted

    def _take(self, key: bytes) -> Entry:
        """Forget ``key`` (already removed from the order) and return its entry."""
        score = self._scores.pop(key)
        data = self._payloads.pop(key, None) if self._payloads else None
        self._dirty.setdefault(key, True)
        return self._make(key, score, data)

    def push_all(self, entries: Iterable[tuple[Any, Any] | tuple[Any, Any, Any]]) -> list[Entry]:
        """Push ``(item, score)`` or ``(item, score, payload)`` tuples; returns the evicted entries."""
        evicted = []
        for entry in entries:
            out = self.push(*entry)
            if out is not None:
                evicted.append(out)
        return evicted

    def push_many(self, items: Iterable[Any], scores: Iterable[Any], payloads: Iterable[Any] | None = None) -> list[Entry]:
        """:meth:`push` of each ``(item, score[, payload])`` of the columns, in order (lists, pyarrow
        arrays or iterables of equal length; for a batch task's columns); returns the evicted entries.
        Not coalesced: with a ``capacity``, which entries are evicted depends on every push's order."""
        items = items.to_pylist() if hasattr(items, "to_pylist") else list(items)
        scores = scores.to_pylist() if hasattr(scores, "to_pylist") else list(scores)
        if payloads is None:
            columns: Iterable[tuple[Any, ...]] = zip(items, scores)
            count = len(scores)
        else:
            payloads = payloads.to_pylist() if hasattr(payloads, "to_pylist") else list(payloads)
            columns = zip(items, scores, payloads)
            count = min(len(scores), len(payloads))
        if not len(items) == count == len(scores):
            raise InvalidValueError(f"push_many: columns of different lengths ({len(items)} items, {len(scores)} "
                                    f"scores{'' if payloads is None else f', {len(payloads)} payloads'})",
                                    hint="pass one score (and payload) per item", store=self.context.store,
                                    partition=self.context.partition)
        return self.push_all(columns)

    def remove(self, item: Any) -> Entry | None:
        """Remove ``item``; returns its entry, or None if it was absent."""
        self._check_open()
        key = self._key(item)
        old = self._scores.get(key)
        if old is None:
            return None
        if key in self._unplaced:
            del self._unplaced[key]
        else:
            self._sorted.remove((self._sign * old, key))
        return self._take(key)

    def pop(self) -> Entry | None:
        """Remove and return the best entry (highest score for max, lowest for min); None when empty."""
        if self._closed:
            self._check_open()
        if not self._scores:
            return None
        if self._unplaced:
            self._place()
        key = self._sorted.pop(0)[1]
        score = self._scores.pop(key)
        data = self._payloads.pop(key, None) if self._payloads else None
        self._dirty.setdefault(key, True)
        if data is None:  # the common case, inlined: no payload to decode
            try:
                return _new_entry(Entry, (self._kdes(key), score, None))
            except FAST_ERRORS:
                pass  # _make reports it through the serde
        return self._make(key, score, data)

    def pop_worst(self) -> Entry | None:
        """Remove and return the worst entry; None when empty."""
        self._check_open()
        if not self._scores:
            return None
        if self._unplaced:
            self._place()
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
        self._unplaced = {}

    # -- reads ---------------------------------------------------------------------------------
    def peek(self) -> Entry | None:
        """The best entry without removing it; None when empty."""
        self._check_open()
        if not self._scores:
            return None
        if self._unplaced:
            self._place()
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
        if self._unplaced:
            self._place()
        return [self._entry(key) for _, key in self._sorted.islice(0, max(n, 0))]

    def bottom(self, n: int) -> list[Entry]:
        """The ``n`` worst entries, worst first."""
        self._check_open()
        if self._unplaced:
            self._place()
        size = len(self._sorted)
        return [self._entry(key) for _, key in self._sorted.islice(max(size - max(n, 0), 0), size, reverse=True)]

    def rank(self, item: Any) -> int | None:
        """0-based position of ``item`` in the order (0 = best), or None when absent."""
        self._check_open()
        key = self._key(item)
        score = self._scores.get(key)
        if score is None:
            return None
        if self._unplaced:
            self._place()
        return self._sorted.index((self._sign * score, key))

    def __len__(self) -> int:
        self._check_open()
        return len(self._scores)

    def __contains__(self, item: Any) -> bool:
        self._check_open()
        return self._key(item) in self._scores

    def __iter__(self) -> Iterator[Entry]:
        """Entries best first, from a snapshot taken when iteration starts."""
        self._check_open()
        if self._unplaced:
            self._place()
        scores, payloads = self._scores, self._payloads
        snapshot = [(key, scores[key], payloads.get(key)) for _, key in self._sorted]
        return (self._make(key, score, data) for key, score, data in snapshot)

    # -- contract ------------------------------------------------------------------------------
    def flush(self) -> None:
        """Log one record per item changed since the last flush (its ``(score, payload)``, or a
        tombstone), flush the changelog, then persist the same changes and the offset atomically."""
        self._check_open()
        get, payloads, pack = self._scores.get, self._payloads, SCORE_HEADER.pack
        # One record per changed item: its value, or a tombstone if it existed at the last flush (an
        # item created and removed since then needs no record).
        items: list[tuple[bytes, bytes | None]] = [
            (key, None if score is None else (pack(score, 1) + payloads[key]) if key in payloads
             else pack(score, 0))
            for key, existed in self._dirty.items() if (score := get(key)) is not None or existed
        ] if payloads else [
            (key, None if score is None else pack(score, 0))
            for key, existed in self._dirty.items() if (score := get(key)) is not None or existed
        ]
        self._commit(items)
        self._dirty = {}

    def restore(self, records: Iterable[ChangelogRecord]) -> None:
        """Apply changelog records (last per item wins, tombstones delete) to local state and to the
        in-memory order; rebuilds the order in bulk when many items changed."""
        self._check_open()
        scores, payloads = self._scores, self._payloads
        before: dict[bytes, float | None] = {}
        # An empty store with no pending changes is rebuilt in bulk afterwards: nothing to remember.
        track = bool(scores) or bool(self._dirty)
        applied = [0]
        header = SCORE_HEADER.size
        unpack = SCORE_HEADER.unpack_from

        def apply(record: ChangelogRecord) -> None:
            key, value = record.key, record.value
            if track and key not in before:
                before[key] = scores.get(key)
            applied[0] += 1
            if value is None:
                scores.pop(key, None)
                payloads.pop(key, None)
                return
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

        try:
            self._restore_records(records, apply)
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
        if len(before) * 8 >= len(scores):
            self._rebuild()
            return
        sign, order, unplaced = self._sign, self._sorted, self._unplaced
        for key, old in before.items():
            if key in unplaced:
                del unplaced[key]
            elif old is not None:
                order.remove((sign * old, key))
            if key in scores:
                unplaced[key] = sign * scores[key]

    # -- helpers -------------------------------------------------------------------------------
    def _key(self, item: Any) -> bytes:
        try:
            return self._kser(item)
        except FAST_ERRORS:
            return self._slow(self.context.key_serde.serialize, item, "item")

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
            item = self._kdes(key)
            payload = None if data is None else self._vdes(data)
        except FAST_ERRORS:
            item = self._slow(self.context.key_serde.deserialize, key, "stored item")
            payload = None if data is None else self._slow(self.context.value_serde.deserialize, data,
                                                           "stored payload")
        return _new_entry(Entry, (item, score, payload))
