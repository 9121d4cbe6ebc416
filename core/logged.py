"""The logged-store layer every engine persists through (Samza's LoggedStore, Kafka Streams'
ChangeLoggingKeyValueBytesStore): one store partition's backend and changelog, and the protocol that
ties them together.

Guarantees:

* :meth:`LoggedStore.commit` appends the given records to the changelog, flushes it (end offset ``n``),
  then makes the local writes *and* ``n`` (plus the engine's own metadata) one atomic backend write.
  So local state never runs ahead of the changelog, and :meth:`LoggedStore.local_offset` is the offset
  of the last completed commit: a reopen with current local state needs no replay.
* :meth:`LoggedStore.spill` writes before a commit without moving the recorded offset (the records
  are made durable first).
* With ``write_behind``, the local write of a commit runs on a background thread after the changelog
  flush: the commit is durable once the changelog is flushed (the changelog is the source of truth),
  and the backend may lag by that one write. At most one write is in flight; :meth:`LoggedStore.settle`
  waits for it (every other local write, and :meth:`close`, settle first). A crash before it lands
  leaves the backend at the previous offset, and recovery replays the tail from the changelog. A failed
  background write is raised, typed, by the next settle and by every later one.
* Opening discards, in this one place, local state that cannot be trusted: data without a recorded
  offset, data in another engine layout (``local_format``), or data the backend reports damaged.

Engines keep what is theirs: serdes and caches (kv), in-memory structures and segments (heap),
sketch units (sketch). They hand the layer their records and their local writes.
"""

from __future__ import annotations

import logging
import struct
from abc import ABC, abstractmethod
from concurrent.futures import Future, ThreadPoolExecutor
from operator import itemgetter
from typing import Callable, Collection, Iterable, Iterator, Mapping

from localstate.core.backend import Item, KVBackend, SortedRun, coalesce_sorted
from localstate.core.changelog import ChangelogRecord, ChangelogWriter, RecordColumns
from localstate.core.engine import StoreContext
from localstate.errors import LocalStateError, StoreClosedError, StoreError

__all__ = ["ChangelogCommit", "LoggedStore", "META_OFFSET", "META_FORMAT", "encode_offset", "decode_offset"]

log = logging.getLogger(__name__)

#: Metadata key under which a backend stores the changelog offset its data reflects.
META_OFFSET = b"local_offset"
#: Metadata key of an engine's local layout version (engines that have one: see ``local_format``).
META_FORMAT = b"heap_format"
_OFFSET = struct.Struct(">Q")


def encode_offset(offset: int) -> bytes:
    """The stored form of a local offset (8 bytes, big-endian)."""
    return _OFFSET.pack(offset)


def decode_offset(raw: bytes | None) -> int | None:
    """The local offset stored as ``raw`` (None when absent or unreadable)."""
    if raw is None or len(raw) != _OFFSET.size:
        return None
    return _OFFSET.unpack(raw)[0]


class ChangelogCommit(ABC):
    """The commit template (Quix Streams' prepare/flush): records to the changelog, changelog flush,
    then one atomic local write that includes the end offset. Subclasses provide the local write:
    :class:`LoggedStore` (a backend write batch) or an engine with its own local structure (the
    search engine: a tantivy commit with its opstamp marker). Needs ``changelog`` and ``_offset``."""

    changelog: ChangelogWriter
    _offset: int | None

    def commit(self, records: Collection[Item], writes: Collection[Item] | None = None, *,
               deletes: bool = True) -> int:
        """Log ``records`` (one per changed key; None deletes), flush the changelog, then make
        ``writes`` (default: the records themselves) local together with the new end offset.
        Returns the end offset."""
        if records:
            self.changelog.append_many(records)
        end = self.changelog.flush()
        self._write_local(records if writes is None else writes, end, deletes)
        self._offset = end
        return end

    @abstractmethod
    def _write_local(self, writes: Collection[Item], end: int, deletes: bool) -> None:
        """Make ``writes`` and the offset ``end`` local in one atomic step (raise on failure: the
        offset then stays at the previous commit)."""


class LoggedStore(ChangelogCommit):
    """A backend whose every committed change is in the changelog first; owns the local offset."""

    def __init__(self, context: StoreContext, backend: KVBackend, *, local_format: bytes | None = None,
                 write_behind: bool = False) -> None:
        """Take ``backend`` (already open) for ``context``'s partition and read its local offset,
        discarding local state that cannot be trusted (see the module docstring). ``local_format``:
        the engine's layout version, stored with every commit; other layouts are discarded.
        ``write_behind``: apply each commit's local write on a background thread (see the module
        docstring); the caller must not read the backend while :attr:`writing` unless the backend
        has ``concurrent_reads``."""
        self.backend = backend
        self._executor = (ThreadPoolExecutor(1, thread_name_prefix=f"localstate-{context.store}-{context.partition}")
                          if write_behind else None)
        self._in_flight: Future | None = None
        self._behind_error: BaseException | None = None
        self.changelog: ChangelogWriter = context.changelog
        self.store = context.store
        self.partition = context.partition
        self.local_format = local_format
        self._meta: dict[bytes, bytes] = {} if local_format is None else {META_FORMAT: local_format}
        self.closed = False
        try:
            self._offset = self._usable_offset()
        except Exception as exc:
            if backend.corruption(exc) is None:
                raise
            # Damaged local state is only a cache of the changelog: start empty, the runtime rebuilds it.
            log.warning("store %s partition %d: local %s state is damaged (%s); discarding it",
                        self.store, self.partition, backend.name, exc)
            backend.discard()
            self._offset = None

    # -- opening -------------------------------------------------------------------------------
    def _read_offset(self) -> int | None:
        raw = self.backend.get_meta(META_OFFSET)
        offset = decode_offset(raw)
        if raw is not None and offset is None:
            log.warning("store %s partition %d: unreadable local offset %r", self.store, self.partition, raw)
        return offset

    def has_rows(self) -> bool:
        """Whether the backend holds any data row."""
        return bool(self.backend._scan(None, None, None, False, 1))

    def _usable_offset(self) -> int | None:
        offset = self._read_offset()
        if not self.backend.persistent:
            return offset
        if self.local_format is not None:
            found = self.backend.get_meta(META_FORMAT)
            if found != self.local_format and (found is not None or offset is not None or self.has_rows()):
                self.discard(f"local state has format {found!r}, this store reads {self.local_format!r}")
                return None
        if offset is None and self.has_rows():
            # Data without a recorded offset (e.g. a spill before the first commit, or a damaged
            # offset): unusable, because the runtime will rebuild from offset 0 on top of it.
            self.discard("local data has no valid offset")
        return offset

    def discard(self, reason: str) -> None:
        """Throw local state away (it is rebuilt from the changelog); the local offset becomes None."""
        log.warning("store %s partition %d: %s; discarding it (it is rebuilt from the changelog)",
                    self.store, self.partition, reason)
        self.backend.clear()
        self._offset = None

    @property
    def local_meta(self) -> dict[bytes, bytes] | None:
        """Metadata every local write carries (the layout version), or None."""
        return self._meta or None

    # -- the commit protocol ---------------------------------------------------------------------
    def local_offset(self) -> int | None:
        """The changelog offset the backend's data reflects (None: no usable local state)."""
        return self._offset

    def _write_local(self, writes: Collection[Item], end: int, deletes: bool) -> None:
        meta = {META_OFFSET: _OFFSET.pack(end), **self._meta}
        if self._executor is None:
            self.write(writes, meta, deletes=deletes)
            return
        self.settle()
        self._in_flight = self._executor.submit(self._apply, writes, meta, deletes)

    @property
    def background(self) -> bool:
        """Whether commits write the backend in the background (write-behind)."""
        return self._executor is not None

    @property
    def writing(self) -> bool:
        """Whether a background local write may still be running (write-behind only)."""
        return self._in_flight is not None

    def settle(self) -> None:
        """Wait for the background local write, if any; raise the error of a failed one (then and at
        every later call: the backend missed a commit, so this store must be reopened and recovered)."""
        future, self._in_flight = self._in_flight, None
        if future is not None:
            try:
                future.result()
            except BaseException as exc:  # noqa: BLE001 - kept and re-raised below, typed by _apply
                self._behind_error = exc
        if self._behind_error is not None:
            raise self._behind_error

    def spill(self, records: Collection[Item], *, deletes: bool = True) -> None:
        """Write ``records`` locally before a commit: logged and flushed first, offset unchanged."""
        self.changelog.append_many(records)
        self.changelog.flush()
        self.write(records, None, deletes=deletes)

    def write(self, items: Collection[Item], meta: Mapping[bytes, bytes] | None = None, *,
              deletes: bool = True) -> None:
        """One atomic local write (not logged: restore and the commit steps above use it), after any
        background write."""
        self.settle()
        self._apply(items, meta if meta is not None else self.local_meta, deletes)

    def _apply(self, items: Collection[Item], meta: Mapping[bytes, bytes] | None, deletes: bool) -> None:
        try:
            self.backend.write(items, meta, deletes=deletes)
        except LocalStateError:
            raise
        except Exception as exc:
            raise self.failed(exc) from exc

    def restore(self, records: Iterable[ChangelogRecord], batch_size: int,
                prepare: Callable[[Mapping[bytes, bytes | None]], Mapping[bytes, bytes | None]] | None = None
                ) -> None:
        """Apply changelog records in order (last per key wins), ``batch_size`` keys per atomic write,
        in key order (cheaper for RocksDB and LMDB). Not re-logged; the local offset moves at the next
        commit. ``prepare`` may check or filter each chunk (and drop the engine's caches of its keys)."""
        chunk: dict[bytes, bytes | None] = {}
        deletes = False
        for record in records:
            value = chunk[record.key] = record.value
            if value is None:
                deletes = True
            if len(chunk) >= batch_size:
                self._restore_chunk(chunk, deletes, prepare)
                chunk, deletes = {}, False
        if chunk:
            self._restore_chunk(chunk, deletes, prepare)

    def restore_columns(self, columns: Iterable[RecordColumns], batch_size: int,
                        prepare: Callable[[Mapping[bytes, bytes | None]], Mapping[bytes, bytes | None]] | None = None
                        ) -> None:
        """:meth:`restore` from :class:`RecordColumns` runs through the backend's bulk load (see
        ``KVBackend.bulk_load``: each chunk atomic, all durable at the end), in chunks of about the
        backend's bulk run size (``bulk_run_keys``; ``batch_size`` is the record path's), the last
        value of each key winning, with no Python step per record: :class:`SortedRun` chunks for a
        backend that bulk-writes in key order (``sorted_bulk_runs``), else dicts. ``prepare`` sees
        each chunk before the backend does (and may return a replacement)."""
        limit = self.backend.bulk_run_keys
        runs = _sorted_chunks(columns, limit) if self.backend.sorted_bulk_runs else _dict_chunks(columns, limit)
        chunks = runs if prepare is None else map(prepare, runs)
        self.settle()  # a background (write-behind) commit write lands before the bulk load
        try:
            self.backend.bulk_load(chunks)
        except LocalStateError:
            raise
        except Exception as exc:
            raise self.failed(exc) from exc

    def _restore_chunk(self, chunk: dict[bytes, bytes | None], deletes: bool,
                       prepare: Callable[[dict[bytes, bytes | None]], dict[bytes, bytes | None]] | None) -> None:
        if prepare is not None:
            prepared = prepare(chunk)
            # a prepare that replaced the chunk may have turned values into tombstones (ttl: expired)
            deletes = deletes or prepared is not chunk
            chunk = prepared
        self.write(sorted(chunk.items(), key=itemgetter(0)), deletes=deletes)

    def failed(self, exc: Exception) -> Exception:
        """The error to raise for a failed backend read or write: StoreCorruptError when the backend
        reports damage (never mistaken for a task bug), else a StoreError naming the store."""
        if isinstance(exc, LocalStateError):
            return exc
        error = self.backend.corruption(exc)
        if error is not None:
            return error
        return StoreError(f"{self.backend.name} backend failed in store {self.store!r}: {type(exc).__name__}: "
                          f"{exc}", hint="check the disk and the store directory", store=self.store,
                          partition=self.partition)

    # -- lifecycle -------------------------------------------------------------------------------
    def check_open(self) -> None:
        """StoreClosedError once the store is closed."""
        if self.closed:
            raise StoreClosedError(f"store {self.store!r} is closed", store=self.store, partition=self.partition,
                                   hint="open the store again; do not keep references to it after close()")

    def close(self) -> None:
        """Wait for a background write, then release the backend. Idempotent. A failed background
        write is only logged here: its commit is in the changelog, and the next open replays it."""
        if not self.closed:
            self.closed = True
            try:
                self.settle()
            except Exception as exc:  # noqa: BLE001 - reported, not lost: see the docstring
                log.warning("store %s partition %d: a background local write failed (%s); the next open "
                            "replays it from the changelog", self.store, self.partition, exc)
            finally:
                if self._executor is not None:
                    self._executor.shutdown(wait=True)
                self.backend.close()


def _dict_chunks(columns: Iterable[RecordColumns], limit: int) -> Iterator[dict[bytes, bytes | None]]:
    """Column runs coalesced into dicts of at least ``limit`` keys (the last may be smaller), in C
    (``dict.update(zip(...))``: each key hashed once, no Python step per record)."""
    chunk: dict[bytes, bytes | None] = {}
    for run in columns:
        chunk.update(zip(run.keys, run.values))
        if len(chunk) >= limit:
            yield chunk
            chunk = {}
    if chunk:
        yield chunk


def _sorted_chunks(columns: Iterable[RecordColumns], limit: int) -> Iterator[SortedRun]:
    """Column runs coalesced into :class:`SortedRun` chunks (``coalesce_sorted``: no dict, no item
    tuples). Each coalesces at least ``limit`` records; a result with fewer than ``limit // 2`` keys
    (a log of few, often updated keys) is carried into the next one, so that chunks, and the SST
    files or transactions made of them, stay big."""
    key_runs: list[list[bytes] | tuple[bytes, bytes]] = []
    value_runs: list[list[bytes | None] | None] = []
    records = 0
    for run in columns:
        if run.framed is not None:  # still in the bytes read: objects only for the records kept
            key_runs.append(run.framed)
            value_runs.append(None)
        else:
            key_runs.append(run.keys)
            value_runs.append(run.values)
        records += len(run)
        if records >= limit:
            chunk = coalesce_sorted(key_runs, value_runs)
            if len(chunk) >= limit // 2:
                yield chunk
                key_runs, value_runs, records = [], [], 0
            else:
                key_runs, value_runs, records = [chunk.key_column], [chunk.value_column], len(chunk)
    if records:
        yield coalesce_sorted(key_runs, value_runs)
