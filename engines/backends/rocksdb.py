"""RocksDB backend through rocksdict in raw mode.

User data lives in the default column family, metadata (the local offset) in the ``localstate_meta``
column family, and every :meth:`write` is one ``WriteBatch`` covering both, so data and offset are
always consistent after a crash. Scans use a short-lived iterator per chunk (see ``base``)."""

from __future__ import annotations

import logging
from collections import deque
from itertools import starmap
from pathlib import Path
from typing import Any, Collection, Iterable, Mapping, Sequence

import rocksdict

from localstate.core.backend import DirectoryBackend, Item, has_deletes, sorted_items
from localstate.core.corruption import store_corrupt
from localstate.errors import StoreCorruptError, StoreError
from localstate.core.options import parse_size

__all__ = ["RocksDBBackend", "META_CF", "build_options"]

log = logging.getLogger(__name__)

META_CF = "localstate_meta"
#: The SST file a bulk load writes in the store directory before ingesting it.
_BULK_FILE = "bulk-load.sst.tmp"


def build_options(options: Mapping[str, Any]) -> rocksdict.Options:
    """rocksdict Options from validated engine options (tuning knobs + ``rocksdb`` pass-through)."""
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_write_buffer_size(parse_size(options.get("write_buffer_size", "16MB")))
    # Every write also puts the local offset into the metadata column family, whose memtable never
    # fills: without atomic flush each write-ahead log file would stay until the total passed
    # max_total_wal_size (by default 4x every column family's write buffers: hundreds of MB per
    # store partition, all replayed when the store reopens). Flushing both together frees each log.
    opts.set_atomic_flush(True)
    table = rocksdict.BlockBasedOptions()
    cache_size = parse_size(options.get("block_cache_size", "64MB"))
    if cache_size > 0:
        table.set_block_cache(rocksdict.Cache(cache_size))
    else:
        table.disable_cache()
    bloom = int(options.get("bloom_bits", 10))
    if bloom > 0:
        table.set_bloom_filter(bloom, False)
        # A whole-key bloom filter on the memtable (10% of its size) lets a point read of a key that
        # is not in the memtable skip the skiplist search: most reads of a store bigger than the
        # memtable, and every read of an absent key.
        opts.set_memtable_prefix_bloom_ratio(0.1)
        opts.set_memtable_whole_key_filtering(True)
    opts.set_block_based_table_factory(table)
    compression = options.get("compression", "lz4")
    opts.set_compression_type(getattr(rocksdict.DBCompressionType, compression)())
    for name, value in (options.get("rocksdb") or {}).items():
        getattr(opts, f"set_{name}")(value)
    return opts


class RocksDBBackend(DirectoryBackend):
    """One RocksDB database per store partition (directory ``<store dir>/rocksdb``)."""

    name = "rocksdb"
    label = "RocksDB"
    concurrent_reads = True  # RocksDB reads and writes are thread-safe (and rocksdict holds the GIL)
    sorted_writes = False  # the memtable orders writes itself: sorting in Python only costs
    sorted_bulk_runs = True  # but a restore's runs become SST files, written in key order

    def __init__(self, path: Path, options: Mapping[str, Any], *, store: str = "",
                 partition: int | None = None) -> None:
        super().__init__(path, store=store, partition=partition)
        self._options = dict(options)
        self._db: rocksdict.Rdict | None = None
        self._meta_handle: Any = None
        self._open()

    def _connect(self) -> None:
        self._db = rocksdict.Rdict(str(self._path), options=build_options(self._options),
                                   column_families={META_CF: rocksdict.Options(raw_mode=True)})
        try:
            self._meta_handle = self._db.get_column_family_handle(META_CF)
        except BaseException:
            self._release()
            raise
        # Point reads go straight to rocksdict (no Python frame): the cache-miss path is hot in
        # large stores. Rdict.get returns None for a missing key, as KVBackend.get must.
        self.get = self._db.get  # type: ignore[method-assign]

    def _in_use_error(self, exc: BaseException) -> StoreError | None:
        text = str(exc)
        if "lock" not in text.lower():
            return None
        return StoreError(f"RocksDB at {self._path} is in use by another process or handle: {text}",
                          store=self._store, partition=self._partition,
                          hint="make sure only one task instance opens this store partition")

    def get(self, key: bytes) -> bytes | None:
        return self._db.get(key)  # type: ignore[union-attr]

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        return self._db.get(list(keys))  # type: ignore[union-attr]

    def get_meta(self, key: bytes) -> bytes | None:
        meta = self._db.get_column_family(META_CF)  # type: ignore[union-attr]
        try:
            return meta.get(key)
        finally:
            del meta  # a live column-family handle would keep the DB lock after close()

    def approximate_count(self) -> int:
        return int(self._db.property_int_value("rocksdb.estimate-num-keys") or 0)  # type: ignore[union-attr]

    def corruption(self, exc: BaseException) -> StoreCorruptError | None:
        if isinstance(exc, StoreCorruptError):
            return exc
        text = str(exc)
        # rocksdict raises plain Exception carrying RocksDB's Status text ("Corruption: block checksum
        # mismatch ...").
        if type(exc) is Exception and ("Corruption" in text or "checksum" in text.lower()):
            return store_corrupt(self._path, "RocksDB", text, store=self._store, partition=self._partition)
        return None

    def _scan(self, start: bytes | None, end: bytes | None, after: bytes | None, reverse: bool,
              limit: int) -> list[tuple[bytes, bytes]]:
        try:
            return self._scan_checked(start, end, after, reverse, limit)
        except Exception as exc:
            error = self.corruption(exc)
            if error is None:
                raise
            raise error from exc

    def _scan_checked(self, start: bytes | None, end: bytes | None, after: bytes | None, reverse: bool,
                      limit: int) -> list[tuple[bytes, bytes]]:
        """The scan; an iterator that stops because of an error (a failed block checksum) is not the
        end of the data: its status() raises, so a damaged store is never read as a shorter one."""
        it = self._db.iter()  # type: ignore[union-attr]
        out: list[tuple[bytes, bytes]] = []
        try:
            if reverse:
                bound = after if after is not None else end
                if bound is None:
                    it.seek_to_last()
                else:
                    it.seek_for_prev(bound)
                    if it.valid() and it.key() == bound:
                        it.prev()
                while it.valid() and len(out) < limit:
                    key = it.key()
                    if start is not None and key < start:
                        break
                    out.append((key, it.value()))
                    it.prev()
            else:
                if after is not None:
                    it.seek(after)
                    if it.valid() and it.key() == after:
                        it.next()
                elif start is not None:
                    it.seek(start)
                else:
                    it.seek_to_first()
                while it.valid() and len(out) < limit:
                    key = it.key()
                    if end is not None and key >= end:
                        break
                    out.append((key, it.value()))
                    it.next()
            if len(out) < limit:
                it.status()
        finally:
            del it
        return out

    def _write(self, items: Collection[Item], meta: Mapping[bytes, bytes], deletes: bool) -> None:
        batch = rocksdict.WriteBatch(raw_mode=True)
        put = batch.put
        if deletes:
            delete = batch.delete
            for key, value in items:
                if value is None:
                    delete(key)
                else:
                    put(key, value)
        else:
            deque(starmap(put, items), maxlen=0)  # put(key, value) for each item, looping in C
        for key, value in meta.items():
            batch.put(key, value, self._meta_handle)
        self._db.write(batch)  # type: ignore[union-attr]

    def _bulk_load(self, chunks: Iterable[Mapping[bytes, bytes | None]]) -> None:
        """Bulk ingestion: chunks merged into runs (:meth:`_runs`), each written in key order to an
        SST file with ``SstFileWriter`` and ingested (moved into the database, atomically, durable on
        return). No memtable, no write-ahead log: about twice as fast as write batches, sort
        included. Ingested files take sequence numbers above everything in the database, so they
        override older values."""
        for run in self._runs(chunks):
            self._ingest(run)

    def _ingest(self, run: Mapping[bytes, bytes | None]) -> None:
        """Write ``run`` (key -> value, None deletes) to one SST file in the store directory and
        ingest it; the file is moved into the database (or removed on failure)."""
        db = self._db
        assert db is not None
        path = self._path / _BULK_FILE
        path.unlink(missing_ok=True)  # a leftover of a crash, or anything planted there: never followed
        writer = rocksdict.SstFileWriter(options=build_options(self._options))
        try:
            writer.open(str(path))
            items = sorted_items(run)
            if has_deletes(run):
                for key, value in items:
                    if value is None:
                        del writer[key]  # a tombstone: deletes the key's older versions
                    else:
                        writer[key] = value
            else:
                deque(starmap(writer.__setitem__, items), maxlen=0)  # the loop runs in C
            writer.finish()
            options = rocksdict.IngestExternalFileOptions()
            options.set_move_files(True)
            db.ingest_external_file([str(path)], options)
        finally:
            path.unlink(missing_ok=True)  # moved into the database on success

    def _release(self) -> None:
        self._meta_handle = None
        self.__dict__.pop("get", None)  # the bound Rdict.get would keep the database alive
        db, self._db = self._db, None
        if db is not None:
            db.close()  # may raise (disk full); the handle is dropped either way
