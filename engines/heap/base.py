"""What both heap engines share: local persistence through the logged-store layer
(:mod:`localstate.core.logged`) on a storage backend plugin (RocksDB, LMDB or memory), segments,
bulk restore, and error helpers.

The in-memory structure (a ``SortedList`` plus dicts) is the truth between two flushes, and
:meth:`HeapEngineBase._commit` hands the layer only the changes coalesced since the previous flush as
changelog records, with one segment (below) as the local write: the layer logs them, flushes the
changelog, and writes the segment *and* the end offset atomically, so ``local_offset()`` is the offset
of the last completed flush and a reopen with current local state needs no replay.

**Local layout.** The heap never reads single entries back (everything it needs is in memory), so
local state is not one backend row per item: each flush writes its whole change set as *one* row, a
*segment* (key ``heap-seg:`` + 8-byte big-endian sequence number, value the ``marshal``-encoded list
of ``(key, value | None)`` pairs — the changelog records themselves). Opening replays the segments in
order (last value per key wins). When the segments hold more than ``4 x live entries + 65,536`` pairs,
the next flush replaces them all by a snapshot of the live entries in the same atomic write, so space
and reopen time stay proportional to the heap. This costs about one ``marshal`` call per flush instead
of one backend write per changed item. A layout this version does not know (another format, another
``marshal`` version, undecodable rows) is discarded with a warning and rebuilt from the changelog.
A non-persistent backend (``memory``) is never written at all.
"""

from __future__ import annotations

import logging
import marshal
import struct
from typing import Any, Callable, Iterable, NoReturn

from localstate.core.registry import open_store_backend
from localstate.core.changelog import ChangelogRecord
from localstate.core.codecs import fast_codec
from localstate.core.engine import StorageEngine, StoreContext
from localstate.core.logged import LoggedStore
from localstate.core.text import a
from localstate.engines.heap.options import backend_options_of
from localstate.errors import InvalidValueError, LateEventError, LocalStateError, RestoreError, SerdeError

__all__ = ["HeapEngineBase", "LateEventError", "fast_codec", "SEGMENT_PREFIX", "LOCAL_FORMAT"]

log = logging.getLogger(__name__)

_U64 = struct.Struct(">Q")
SEGMENT_PREFIX = b"heap-seg:"
LOCAL_FORMAT = b"heap-segments/1 marshal/%d" % marshal.version
"""Local layout version; the meta value written with every flush is this plus the kind (``topn`` or
``reorder``). Local state with another value is discarded (rebuilt from the changelog)."""
_SNAPSHOT_CHUNK = 65_536  # pairs per snapshot segment (keeps single backend values moderate)
_COMPACT_SLACK = 65_536


class HeapEngineBase(StorageEngine):
    """Opens the backend chosen by ``backend`` (with the store's backend options) under the
    store's directory, and implements local offsets, flush, restore and close around the subclass's
    in-memory structure. Subclasses load themselves from :meth:`_local_rows` and provide
    :meth:`_snapshot` (their live rows) for segment compaction."""

    kind: str = ""
    """``topn`` or ``reorder`` (the store's ``kind``): part of the local format, so a store whose kind
    changed is rebuilt."""

    def __init__(self, context: StoreContext) -> None:
        super().__init__(context)
        options = backend_options_of(context.store, context.options)
        backend = open_store_backend(context, options)
        self._persistent: bool = backend.persistent
        self._restore_batch = int(options.get("restore_batch_size") or 10_000)
        self._closed = False
        self._kser, self._kdes = fast_codec(context.key_serde)
        self._vser, self._vdes = fast_codec(context.value_serde)
        self._first_segment = 0  # segments [first, next) hold local state
        self._next_segment = 0
        self._segment_pairs = 0  # pairs stored in them (compaction trigger)
        self._format = LOCAL_FORMAT + b" " + self.kind.encode()
        self._logged = LoggedStore(context, backend, local_format=self._format)
        self._backend = backend

    # -- contract ------------------------------------------------------------------------------
    def local_offset(self) -> int | None:
        self._check_open()
        return self._logged.local_offset()

    def close(self) -> None:
        """Release the backend and the in-memory structure. Unflushed changes are discarded. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._logged.close()
        self._drop_memory()

    def _drop_memory(self) -> None:
        """Release the in-memory structure (subclasses)."""

    def _snapshot(self) -> list[tuple[bytes, bytes]]:
        """Every live row ``(key, value)`` as the changelog would hold it after a compaction."""
        raise NotImplementedError

    def _live_count(self) -> int:
        """Number of live rows (compaction trigger)."""
        raise NotImplementedError

    # -- local state -----------------------------------------------------------------------------
    def _discard_local(self, reason: str) -> None:
        self._logged.discard(reason)
        self._first_segment = self._next_segment = self._segment_pairs = 0

    def _local_rows(self) -> dict[bytes, bytes]:
        """Local state as ``key -> value``: the segments replayed in order, tombstones dropped.
        Undecodable local state is discarded (empty result, no local offset)."""
        rows: dict[bytes, bytes | None] = {}
        if not self._persistent or self._logged.local_offset() is None:
            return {}
        first = None
        try:
            with self._backend.iterate(None, None) as segments:
                for key, blob in segments:
                    if len(key) != len(SEGMENT_PREFIX) + 8 or not key.startswith(SEGMENT_PREFIX):
                        raise ValueError(f"unexpected local key {key[:32]!r}")
                    pairs = marshal.loads(blob)
                    if type(pairs) is not list:
                        raise ValueError(f"segment {key!r} holds {a(type(pairs).__name__)}, not a list")
                    rows.update(pairs)
                    self._segment_pairs += len(pairs)
                    number = _U64.unpack_from(key, len(SEGMENT_PREFIX))[0]
                    first = number if first is None else first
                    self._next_segment = number + 1
        except (ValueError, EOFError, TypeError) as exc:
            self._discard_local(f"undecodable local heap state ({exc})")
            return {}
        self._first_segment = first or 0
        if None in rows.values():
            return {key: value for key, value in rows.items() if value is not None}
        return rows  # type: ignore[return-value]

    def _segment(self, pairs: list[tuple[bytes, bytes | None]]) -> tuple[bytes, bytes]:
        """A new segment row holding ``pairs``."""
        key = SEGMENT_PREFIX + _U64.pack(self._next_segment)
        self._next_segment += 1
        self._segment_pairs += len(pairs)
        return key, marshal.dumps(pairs)

    def _compaction(self) -> list[tuple[bytes, bytes | None]]:
        """Backend writes replacing every segment by a snapshot of the live rows."""
        writes: list[tuple[bytes, bytes | None]] = [
            (SEGMENT_PREFIX + _U64.pack(number), None) for number in range(self._first_segment, self._next_segment)]
        self._first_segment, self._segment_pairs = self._next_segment, 0
        rows = self._snapshot()
        for start in range(0, len(rows), _SNAPSHOT_CHUNK):
            writes.append(self._segment(rows[start:start + _SNAPSHOT_CHUNK]))
        return writes

    def _commit(self, items: list[tuple[bytes, bytes | None]]) -> None:
        """Log ``items`` (one record per changed key; None deletes), flush the changelog, then write
        them as one segment (or a compaction) and the new end offset to the backend atomically."""
        writes: list[tuple[bytes, bytes | None]] = []
        if not self._persistent:
            pass  # a memory backend is never written: the in-memory structure is the whole state
        elif self._segment_pairs + len(items) > 4 * self._live_count() + _COMPACT_SLACK:
            writes = self._compaction()
        elif items:
            writes = [self._segment(items)]
        self._logged.commit(items, writes)

    def _restore_records(self, records: Iterable[ChangelogRecord],
                         apply: Callable[[ChangelogRecord], None]) -> None:
        """Call ``apply`` (the in-memory update) on each record and write the records to the backend,
        one segment per ``restore_batch_size`` records. Not re-logged; the local offset is untouched
        (recovery flushes afterwards, which records it)."""
        pairs: list[tuple[bytes, bytes | None]] = []
        size, persistent = self._restore_batch, self._persistent
        try:
            for record in records:
                apply(record)
                if persistent:
                    pairs.append((record.key, record.value))
                    if len(pairs) >= size:
                        self._backend.write([self._segment(pairs)], self._logged.local_meta)
                        pairs = []
            if pairs:
                self._backend.write([self._segment(pairs)], self._logged.local_meta)
        except LocalStateError:
            raise
        except Exception as exc:  # a backend failure mid-restore
            raise RestoreError(f"restoring store {self.context.store!r} failed: {type(exc).__name__}: {exc}",
                               store=self.context.store, partition=self.context.partition,
                               hint="delete the store partition's local directory and restart to rebuild "
                                    "it from the changelog") from exc

    # -- helpers -------------------------------------------------------------------------------
    def _check_open(self) -> None:
        self._logged.check_open()

    def _serde_error(self, exc: SerdeError, what: str) -> SerdeError:
        return SerdeError(f"store {self.context.store!r}: cannot use this {what}: {exc.message}",
                          hint=exc.hint or f"check the store's {what} serde", store=self.context.store,
                          partition=self.context.partition)

    def _slow(self, serde_call: Callable[[Any], Any], value: Any, what: str) -> Any:
        """Run the serde itself after a fast-path failure: it raises a SerdeError, which is reported
        with the store and partition (or, for odd inputs the fast path refused, it succeeds)."""
        try:
            return serde_call(value)
        except SerdeError as exc:
            raise self._serde_error(exc, what) from None

    def _corrupt(self, record: ChangelogRecord | None, reason: str) -> NoReturn:
        raise RestoreError(
            f"store {self.context.store!r}: undecodable heap record"
            f"{'' if record is None else f' key={record.key[:32]!r}'}: {reason}",
            store=self.context.store, partition=self.context.partition,
            offset=None if record is None else record.offset,
            hint="the changelog or local state was written by another engine or kind; check the store's "
                 "engine/kind settings, or delete the local directory and the changelog to start over")

    def _invalid(self, message: str, hint: str, **context: Any) -> InvalidValueError:
        return InvalidValueError(f"store {self.context.store!r}: {message}", hint=hint,
                                 store=self.context.store, partition=self.context.partition, **context)
