"""LMDB backend: named sub-databases ``data`` and ``meta`` in one environment; every :meth:`write`
is one write transaction covering both. The memory map doubles automatically when full
(``MapFullError`` never reaches the caller). Point reads share one read transaction that is ended
before every write (so it always shows the last commit and never holds back page reuse or map
growth); scans use a short read transaction per chunk (see ``base`` for snapshot iteration)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Collection, Iterable, Mapping, Sequence

import lmdb

from localstate.core.backend import DirectoryBackend, Item, has_deletes, payload_bytes, sorted_items
from localstate.core.corruption import store_corrupt
from localstate.core.fsutil import open_nofollow
from localstate.core.options import parse_size
from localstate.errors import StoreCorruptError, StoreError

__all__ = ["LMDBBackend"]

log = logging.getLogger(__name__)

#: lmdb errors that mean the files are damaged (LMDB keeps no checksums: these are structural).
_DAMAGE = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError, lmdb.PanicError,
           lmdb.VersionMismatchError, lmdb.IncompatibleError)

_LOCK_FILE_BYTES = 64 << 10
"""Preallocated size of ``lock.mdb``: more than the ~8 KiB LMDB needs for its default 126 readers
(a larger lock file only leaves room for more readers)."""


class LMDBBackend(DirectoryBackend):
    """One LMDB environment per store partition (directory ``<store dir>/lmdb``)."""

    name = "lmdb"
    label = "LMDB"
    min_key_size = 1  # LMDB rejects empty keys
    sorted_bulk_runs = True  # a restore's runs are appended to the B-tree in key order

    def __init__(self, path: Path, options: Mapping[str, Any], *, store: str = "",
                 partition: int | None = None) -> None:
        super().__init__(path, store=store, partition=partition)
        self._map_size = parse_size(options.get("map_size", "64MB"))
        self._sync = bool(options.get("lmdb_sync", True))
        self.grows = 0
        """How many times the map was enlarged since open (statistics)."""
        # Read transaction shared by get/get_many until the next write: beginning one per get costs
        # about three times the lookup itself.
        self._reader: lmdb.Transaction | None = None
        self._open()

    def _connect(self) -> None:
        """Open the environment and its sub-databases."""
        self._env = self._open_env()
        try:
            self._open_dbs()
        except BaseException:
            self._env.close()
            raise

    def _is_damage(self, exc: BaseException) -> bool:
        # Only LMDB's own errors can mean damaged files; an OSError that is no resource problem
        # (say EIO while reserving the lock file) is reported, typed, by the caller.
        return isinstance(exc, lmdb.Error)

    def _in_use_error(self, exc: BaseException) -> StoreError | None:
        if not isinstance(exc, (lmdb.ReadersFullError, lmdb.LockError)):
            return None
        return StoreError(f"cannot open LMDB at {self._path}: {exc}", store=self._store, partition=self._partition,
                          hint="check for other processes using this store")

    def _open_dbs(self) -> None:
        """Open the sub-databases and read the first meta entry (damage to the root pages shows here)."""
        self._data = self._env.open_db(b"data")
        self._meta = self._env.open_db(b"meta")
        self.max_key_size = self._env.max_key_size()
        with self._env.begin(db=self._meta) as txn:
            txn.cursor().first()

    def corruption(self, exc: BaseException) -> StoreCorruptError | None:
        if isinstance(exc, StoreCorruptError):
            return exc
        if isinstance(exc, _DAMAGE):
            return store_corrupt(self._path, "LMDB", f"{type(exc).__name__}: {exc}", store=self._store,
                                 partition=self._partition)
        return None

    def _reserve_lock_file(self) -> None:
        """Allocate LMDB's lock file before LMDB maps it: LMDB extends it with ftruncate (a sparse
        file) and writes through the mapping, so on a full disk the first write is a SIGBUS that
        kills the process. Allocated here, a full disk is an ENOSPC instead (typed by the caller)."""
        fd = open_nofollow(self._path / "lock.mdb", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, 0, _LOCK_FILE_BYTES)
        finally:
            os.close(fd)

    def _open_env(self) -> lmdb.Environment:
        self._reserve_lock_file()
        # sync/metasync off trades machine-crash durability of the latest commits for speed; a killed
        # process loses nothing either way (the OS keeps the pages).
        return lmdb.open(str(self._path), map_size=self._map_size, max_dbs=2, sync=self._sync,
                         metasync=self._sync, readahead=False, lock=True)

    def _read_txn(self) -> lmdb.Transaction:
        reader = self._reader
        if reader is None:
            reader = self._reader = self._env.begin(db=self._data)
        return reader

    def _end_reads(self) -> None:
        """End the shared read transaction (before a write, a map resize, a clear or close)."""
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.abort()

    def get(self, key: bytes) -> bytes | None:
        if not 0 < len(key) <= self.max_key_size:
            return None  # LMDB cannot hold such a key (the engine refuses to put one)
        reader = self._reader
        if reader is None:
            reader = self._read_txn()
        return reader.get(key)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        limit = self.max_key_size
        get = self._read_txn().get
        if keys and 0 < min(map(len, keys)) and max(map(len, keys)) <= limit:
            return list(map(get, keys))  # every key of a size LMDB holds: the loop runs in C
        return [get(k) if 0 < len(k) <= limit else None for k in keys]

    def get_meta(self, key: bytes) -> bytes | None:
        with self._env.begin(db=self._meta) as txn:
            return txn.get(key)

    def approximate_count(self) -> int:
        with self._env.begin() as txn:
            return int(txn.stat(self._data)["entries"])

    def _scan(self, start: bytes | None, end: bytes | None, after: bytes | None, reverse: bool,
              limit: int) -> list[tuple[bytes, bytes]]:
        try:
            return self._scan_txn(start, end, after, reverse, limit)
        except _DAMAGE as exc:
            raise self.corruption(exc) from exc  # type: ignore[misc]

    def _scan_txn(self, start: bytes | None, end: bytes | None, after: bytes | None, reverse: bool,
                  limit: int) -> list[tuple[bytes, bytes]]:
        out: list[tuple[bytes, bytes]] = []
        with self._env.begin(db=self._data) as txn:
            cur = txn.cursor()
            if reverse:
                bound = after if after is not None else end
                if bound == b"":
                    return out
                if bound is None:
                    ok = cur.last()
                else:
                    ok = cur.prev() if cur.set_range(bound) else cur.last()
                while ok and len(out) < limit:
                    key = cur.key()
                    if start is not None and key < start:
                        break
                    out.append((key, cur.value()))
                    ok = cur.prev()
            else:
                if after is not None:
                    ok = cur.set_range(after)
                    if ok and cur.key() == after:
                        ok = cur.next()
                elif start:
                    ok = cur.set_range(start)
                else:
                    ok = cur.first()
                while ok and len(out) < limit:
                    key = cur.key()
                    if end is not None and key >= end:
                        break
                    out.append((key, cur.value()))
                    ok = cur.next()
        return out

    def _bulk_load(self, chunks: Iterable[Mapping[bytes, bytes | None]]) -> None:
        """Chunks merged into runs (:meth:`_runs`), each one transaction (one sync) in key order,
        so a B-tree page is written once per run, not once per chunk. Into an empty database with no
        delete, the sorted run is appended (``putmulti(append=True)``: no searches, full pages)."""
        for run in self._runs(chunks):
            items = sorted_items(run)
            deletes = has_deletes(run)
            self._reserve(payload_bytes(run))
            self._write(items, {}, deletes, append=not deletes and self.approximate_count() == 0)

    def _reserve(self, nbytes: int) -> None:
        """Grow the map ahead of a big transaction (room for twice ``nbytes`` beyond the pages in
        use: B-tree overhead), so that it is not aborted and retried whole for every doubling."""
        self._end_reads()
        info, page = self._env.info(), self._env.stat()["psize"]
        while info["map_size"] < (info["last_pgno"] + 1) * page + 2 * nbytes:
            self._grow()
            info = self._env.info()

    def _write(self, items: Collection[Item], meta: Mapping[bytes, bytes], deletes: bool, *,
               append: bool = False) -> None:
        self._end_reads()
        while True:
            try:
                with self._env.begin(write=True, db=self._data) as txn:
                    if deletes:
                        put, delete = txn.put, txn.delete
                        for key, value in items:
                            if value is None:
                                delete(key)
                            else:
                                put(key, value)
                    elif items:
                        txn.cursor().putmulti(items, append=append)  # the loop runs in C
                    for key, value in meta.items():
                        txn.put(key, value, db=self._meta)
                return
            except lmdb.MapFullError:
                self._grow()  # the transaction was aborted: retry it whole in a bigger map

    def _grow(self) -> None:
        size = self._env.info()["map_size"] * 2
        log.info("store %s partition %s: LMDB map full, growing to %d bytes", self._store, self._partition, size)
        self._env.set_mapsize(size)
        self.grows += 1

    def clear(self) -> None:
        self._end_reads()
        with self._env.begin(write=True) as txn:
            txn.drop(self._data, delete=False)
            txn.drop(self._meta, delete=False)

    def _release(self) -> None:
        self._end_reads()
        self._env.close()
