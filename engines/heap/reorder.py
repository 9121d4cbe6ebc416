"""Bounded sort (reorder buffer): buffer out-of-order events, release them in timestamp order.

Keying: each event is stored under ``(timestamp, sequence number)``; the sequence number is a
per-store-partition counter persisted in the changelog (meta record), so duplicates of one timestamp
stay distinct and are released in arrival order, identically after a restore.

Watermark: ``drain_until(w)`` releases every buffered event with ``timestamp <= w`` and raises the
watermark to ``w``. With ``max_lateness = L`` the watermark also follows ``max timestamp seen - L``.
An event is *late* when its timestamp is strictly below the watermark; accepting it could break the
total order of the output, so it goes to ``late_policy``: ``error`` (raise :class:`LateEventError`),
``drop`` (count in ``dropped_late``) or ``side_output`` (collect; read with ``take_late()``).
Released output is therefore totally ordered by ``(timestamp, arrival)``.
"""

from __future__ import annotations

import logging
import math
import numbers
from typing import Any, Iterable, Iterator, NamedTuple

from sortedcontainers import SortedList

from localstate.core.changelog import ChangelogRecord
from localstate.core.codecs import FAST_ERRORS
from localstate.core.engine import StoreContext
from localstate.engines.heap.base import HeapEngineBase
from localstate.engines.heap.codec import (EVENT_KEY_LEN, MAX_EXACT_INT, META_KEY, check_number,
                                           decode_event_stamps, decode_meta, decode_ts, encode_meta, encode_ts,
                                           event_key)
from localstate.engines.heap.options import max_lateness_of
from localstate.errors import LateEventError, StoreError

__all__ = ["BufferedEvent", "ReorderBufferEngine"]

log = logging.getLogger(__name__)

_INT_TS = b"\x00"
_INT_KIND = _INT_TS[0]
_ABSENT = object()
_FLOAT_TS = b"\x01"
_MAX_SEQ = b"\xff" * 8
_new_event = tuple.__new__  # BufferedEvent(...) through a C call (NamedTuple's __new__ is Python code)


class BufferedEvent(NamedTuple):
    """One event and its timestamp (int if it was pushed as an int, else float)."""

    timestamp: int | float
    event: Any


class ReorderBufferEngine(HeapEngineBase):
    """Reorder buffer (``engine = "heap"``, ``kind = "reorder"``).

    In memory: ``SortedList`` of 16-byte event keys (their byte order is timestamp then arrival
    order), the keys pushed since the order was last read (placed in one bulk update by the next
    drain, peek or iteration), and ``dict key -> value bytes``. Changes reach the changelog and the
    local backend at :meth:`flush` only; an event pushed and drained between two flushes is never
    logged at all.
    """

    kind = "reorder"

    def __init__(self, context: StoreContext) -> None:
        super().__init__(context)
        options = context.options
        self.late_policy: str = options.get("late_policy", "error")
        self.max_lateness: float | None = max_lateness_of(options)
        """In timestamp units; None: the watermark only moves with drain_until()."""
        self.dropped_late = 0
        """Late events dropped since this store was opened (``late_policy = "drop"``)."""
        self._late: list[BufferedEvent] = []
        self._keys: SortedList = SortedList()
        self._unplaced: list[bytes] = []  # pushed keys not in _keys yet (placed by _place() before reads)
        self._events: dict[bytes, bytes] = {}
        self._new: dict[bytes, None] = {}  # pushed since the last flush (not in local state)
        self._gone: dict[bytes, None] = {}  # drained since the last flush and present in local state
        self._seq = 0
        self._drained = -math.inf
        self._max_ts = -math.inf
        self._watermark = -math.inf  # cached value of the watermark property (push reads it every time)
        self._meta_dirty = False
        self._load()

    def _load(self) -> None:
        events = self._events
        for key, value in self._local_rows().items():
            if len(key) == EVENT_KEY_LEN:
                events[key] = value
            elif key == META_KEY:
                self._set_meta(None, value)
            else:
                self._corrupt(None, f"unexpected local key {key[:32]!r}")
        self._keys = SortedList(events)
        self._unplaced = []

    def _place(self) -> None:
        """Put the keys pushed since the last read into the order (one bulk update)."""
        self._keys.update(self._unplaced)
        self._unplaced = []

    def _set_meta(self, record: ChangelogRecord | None, value: bytes) -> None:
        try:
            self._seq, self._drained, self._max_ts = decode_meta(value)
        except (ValueError, Exception) as exc:  # struct.error is not a ValueError
            self._corrupt(record, f"meta record: {exc}")
        self._update_watermark()

    def _update_watermark(self) -> None:
        if self.max_lateness is None:
            self._watermark = self._drained
        else:
            self._watermark = max(self._drained, self._max_ts - self.max_lateness)

    def _live_count(self) -> int:
        return len(self._events) + 1

    def _snapshot(self) -> list[tuple[bytes, bytes]]:
        rows = list(self._events.items())
        rows.append((META_KEY, encode_meta(self._seq, self._drained, self._max_ts)))
        return rows

    def _drop_memory(self) -> None:
        self._keys = SortedList()
        self._unplaced = []
        self._events = {}
        self._new = {}
        self._gone = {}
        self._late = []

    # -- writes --------------------------------------------------------------------------------
    @property
    def watermark(self) -> float:
        """Events with a timestamp strictly below this are late (-inf before any drain): the last
        drained watermark, or ``max timestamp seen - max_lateness`` if that is higher."""
        return self._watermark

    def push(self, event: Any, timestamp: int | float) -> bool:
        """Buffer ``event`` at ``timestamp``. Returns True if buffered, False if it was late and
        dropped or side-output (with ``late_policy = "error"`` a late event raises LateEventError)."""
        if self._closed:
            self._check_open()
        if type(timestamp) is int and -MAX_EXACT_INT <= timestamp <= MAX_EXACT_INT:  # the common case
            ts, kind = float(timestamp), _INT_TS
        else:
            ts, kind = self._timestamp(timestamp)
        try:
            data = self._vser(event)
        except FAST_ERRORS:
            data = self._slow(self.context.value_serde.serialize, event, "event")
        if ts < self._watermark:
            return self._late_event(event, timestamp)
        key = event_key(ts, self._seq)
        self._seq += 1
        if ts > self._max_ts:
            self._max_ts = ts
            if self.max_lateness is not None and ts - self.max_lateness > self._watermark:
                self._watermark = ts - self.max_lateness
        self._meta_dirty = True
        self._unplaced.append(key)  # placed in order lazily: a burst of pushes is one bulk update
        self._events[key] = kind + data
        self._new[key] = None
        return True

    def _late_event(self, event: Any, timestamp: int | float) -> bool:
        policy = self.late_policy
        if policy == "drop":
            self.dropped_late += 1
        elif policy == "side_output":
            self._late.append(BufferedEvent(timestamp, event))
        else:
            raise LateEventError(
                f"store {self.context.store!r}: event at timestamp {timestamp!r} is older than the watermark "
                f"{self.watermark!r} and can no longer be released in order",
                store=self.context.store, partition=self.context.partition, timestamp=timestamp,
                watermark=self.watermark, max_lateness=self.max_lateness,
                hint=f"raise max_lateness (now {self.max_lateness}) or drain later, or set "
                     f"late_policy = \"drop\" or \"side_output\" on store {self.context.store!r}")
        return False

    def take_late(self) -> list[BufferedEvent]:
        """Late events collected since the last call (``late_policy = "side_output"``); clears them.
        They are not part of the store's state: read them in the same task step."""
        self._check_open()
        late, self._late = self._late, []
        return late

    def drain_until(self, watermark: int | float) -> list[BufferedEvent]:
        """Remove and return every buffered event with ``timestamp <= watermark``, in timestamp order
        (ties in arrival order), and raise the watermark to ``watermark`` (it never goes back)."""
        self._check_open()
        wm, _ = self._timestamp(watermark, what="watermark", allow_inf=True)
        if self._unplaced:
            self._place()
        keys = self._keys
        end = keys.bisect_right(encode_ts(wm) + _MAX_SEQ)
        if wm > self._drained:
            self._drained = wm
            self._meta_dirty = True
            if wm > self._watermark:
                self._watermark = wm
        if not end:
            return []
        taken = list(keys.islice(0, end))
        del keys[:end]
        events, new, gone, vdes = self._events, self._new, self._gone, self._vdes
        out = []
        try:
            for key, ts in zip(taken, decode_event_stamps(taken)):
                value = events.pop(key)
                if new.pop(key, _ABSENT) is _ABSENT:  # in local state: needs a tombstone
                    gone[key] = None
                out.append(_new_event(BufferedEvent, (int(ts) if value[0] == _INT_KIND else ts, vdes(value[1:]))))
        except FAST_ERRORS:
            self._slow(self.context.value_serde.deserialize, value[1:], "stored event")
            raise
        return out

    def drain(self) -> list[BufferedEvent]:
        """``drain_until(max timestamp seen - max_lateness)``; needs ``max_lateness``."""
        self._check_open()
        if self.max_lateness is None:
            raise StoreError(f"store {self.context.store!r}: drain() needs the max_lateness option",
                             store=self.context.store, partition=self.context.partition,
                             hint="set max_lateness for the store, or call drain_until(watermark)")
        if self._max_ts == -math.inf:
            return []
        return self.drain_until(self.watermark)

    # -- reads ---------------------------------------------------------------------------------
    def peek(self) -> BufferedEvent | None:
        """The next event that would be released, or None when the buffer is empty."""
        self._check_open()
        if not self._events:
            return None
        if self._unplaced:
            self._place()
        return self._decode(self._keys[0])

    def __len__(self) -> int:
        self._check_open()
        return len(self._events)

    def __iter__(self) -> Iterator[BufferedEvent]:
        """Buffered events in release order, from a snapshot (does not remove them)."""
        self._check_open()
        if self._unplaced:
            self._place()
        snapshot = [(key, self._events[key]) for key in self._keys]
        return (self._decode(key, value) for key, value in snapshot)

    @property
    def max_timestamp(self) -> float:
        """Largest timestamp accepted so far (-inf if none)."""
        return self._max_ts

    @property
    def next_sequence(self) -> int:
        return self._seq

    # -- contract ------------------------------------------------------------------------------
    def flush(self) -> None:
        """Log the events pushed (and still buffered) and drained since the last flush, and the meta
        record if it changed; flush the changelog; persist the same changes and the offset atomically."""
        self._check_open()
        events = self._events
        items: list[tuple[bytes, bytes | None]] = [(key, events[key]) for key in self._new]
        if self._meta_dirty:
            items.append((META_KEY, encode_meta(self._seq, self._drained, self._max_ts)))
        if self._gone:
            items += [(key, None) for key in self._gone]
        self._commit(items)
        self._new, self._gone, self._meta_dirty = {}, {}, False

    def restore(self, records: Iterable[ChangelogRecord]) -> None:
        """Apply records to local state and the in-memory buffer (bulk rebuild when large)."""
        self._check_open()
        events = self._events
        touched: set[bytes] = set()

        def apply(record: ChangelogRecord) -> None:
            key = record.key
            if len(key) == EVENT_KEY_LEN:
                touched.add(key)
                if record.value is None:
                    events.pop(key, None)
                elif not record.value:
                    self._corrupt(record, "empty event value")
                else:
                    events[key] = record.value
            elif key == META_KEY:
                if record.value is None:
                    self._seq, self._drained, self._max_ts = 0, -math.inf, -math.inf
                    self._update_watermark()
                else:
                    self._set_meta(record, record.value)
                self._meta_dirty = False
            else:
                self._corrupt(record, "not a reorder-buffer key")

        try:
            self._restore_records(records, apply)
        except BaseException:
            self._keys = SortedList(events)  # keep the order consistent with what was applied
            self._unplaced = []
            raise
        for key in touched:  # restored values are newer than pending changes
            self._new.pop(key, None)
            self._gone.pop(key, None)
        if len(touched) * 8 >= len(events):
            self._keys = SortedList(events)
            self._unplaced = []
            return
        if self._unplaced:
            self._place()
        keys = self._keys
        for key in touched:
            present = key in events
            if key in keys:
                if not present:
                    keys.remove(key)
            elif present:
                keys.add(key)

    # -- helpers -------------------------------------------------------------------------------
    def _timestamp(self, value: Any, what: str = "timestamp", allow_inf: bool = False) -> tuple[float, bytes]:
        kind_of = type(value)
        if kind_of is int and -MAX_EXACT_INT <= value <= MAX_EXACT_INT:  # fast paths
            return float(value), _INT_TS
        if kind_of is float and -math.inf < value < math.inf:
            return (value if value else 0.0), _FLOAT_TS  # -0.0 and 0.0 share one key prefix
        try:
            ts = check_number(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise self._invalid(f"invalid {what} {value!r:.80}: {exc}", f"pass the {what} as an int or float "
                                "(for example epoch milliseconds)") from None
        if isinstance(value, numbers.Integral):
            if not -MAX_EXACT_INT <= int(value) <= MAX_EXACT_INT:
                raise self._invalid(f"integer {what} {value} does not fit a float64 exactly",
                                    f"use a coarser unit (milliseconds or microseconds) for the {what}")
            kind = _INT_TS
        else:
            kind = _FLOAT_TS
        if math.isinf(ts) and not allow_inf:
            raise self._invalid(f"infinite {what} {value!r}", f"pass a finite {what}")
        if ts == 0.0:
            ts = 0.0  # -0.0 and 0.0 must share one key prefix
        return ts, kind

    def _decode(self, key: bytes, value: bytes | None = None) -> BufferedEvent:
        if value is None:
            value = self._events[key]
        ts = decode_ts(key)
        try:
            event = self._vdes(value[1:])
        except FAST_ERRORS:
            event = self._slow(self.context.value_serde.deserialize, value[1:], "stored event")
        return BufferedEvent(int(ts) if value[:1] == _INT_TS else ts, event)
