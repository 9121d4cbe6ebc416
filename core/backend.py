"""The backend contract every engine persists through: an ordered ``bytes -> bytes`` map with atomic
batch writes, side metadata, and snapshot iteration.

Backends are plugins (entry-point group ``localstate.backends``; the built-in ``rocksdb``, ``lmdb`` and
``memory`` live in ``localstate.engines.backends`` and register exactly as a third party would), found
by name through the registry under the same ``plugins.toml`` policy as engines: :func:`~localstate.core.registry.open_backend`
is the one way to open one. Backends know nothing about serdes, caches or changelogs; the logged-store
layer above them (``localstate.core.logged``) does. Snapshot iteration is implemented once, here: a backend only scans short chunks of its *live*
data, and every write made while iterators are open first records, for each open iterator, the
pre-image of the keys it changes. An iterator therefore sees the data as of its opening, holds no
backend handle between chunks (no pinned RocksDB iterator, no open LMDB read transaction), and an
abandoned iterator leaks nothing but a small Python object.
"""

from __future__ import annotations

import errno
import weakref
from abc import ABC, abstractmethod
from bisect import bisect_left
from operator import itemgetter
from pathlib import Path
from typing import Any, ClassVar, Collection, Iterable, Iterator, Mapping, Sequence

from sortedcontainers import SortedDict

from localstate.core.changelog import PLUGIN_API_VERSION, split_spans
from localstate.core.corruption import corrupt_reason, wipe_local
from localstate.core.fsutil import check_tree_no_symlinks, errno_in_text, os_error_hint
from localstate.native import load as load_native
from localstate.errors import LocalStateError, StoreClosedError, StoreCorruptError, StoreError, StoreIOError

__all__ = ["KVBackend", "DirectoryBackend", "BackendIterator", "Item", "RESOURCE_ERRNOS", "prefix_end", "sorted_items", "SortedRun", "coalesce_sorted", "key_sizes", "payload_bytes", "has_deletes"]

RESOURCE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM,
                             errno.EMFILE})
"""OS errors that say the machine, not the store's files, is at fault: rebuilding cannot help."""

Item = tuple[bytes, bytes | None]
"""A change: ``(key, value)``; ``value is None`` deletes the key."""

_FIRST_CHUNK = 64
_MAX_CHUNK = 4096


#: Keys per run a backend's bulk load merges restore chunks into (:meth:`KVBackend._runs`): big
#: enough that a sorted bulk write pays off, small enough to bound a restore's memory.
BULK_RUN_KEYS = 1 << 20


class KVBackend(ABC):
    """Ordered bytes->bytes storage for one store partition.

    Guarantees: :meth:`write` applies all its puts/deletes *and* its metadata atomically (one RocksDB
    WriteBatch, one LMDB transaction, one in-memory update); metadata never shows up in
    :meth:`iterate`; iterators returned by :meth:`iterate` are snapshots and closable.
    """

    name: str = ""
    #: True when the data survives close/reopen (False for the in-memory backend).
    persistent: bool = True
    #: True when point reads (:meth:`get`, :meth:`get_many`) may run while another thread is in
    #: :meth:`write` (write-behind, ``localstate.core.logged``); otherwise readers wait for the write.
    concurrent_reads: ClassVar[bool] = False
    #: True when a big write is cheaper in key order (a B-tree: LMDB), so restore sorts its chunks;
    #: False when the backend orders writes itself (RocksDB's memtable, the in-memory sorted dict).
    sorted_writes: ClassVar[bool] = True
    #: Keys per run of :meth:`bulk_load` (see :meth:`_runs`); the restore path hands chunks this big.
    bulk_run_keys: ClassVar[int] = BULK_RUN_KEYS
    #: True when :meth:`bulk_load` writes each run in key order (an SST file, a B-tree append): the
    #: restore path then hands it :class:`SortedRun` chunks, coalesced and sorted in one C pass with
    #: no dict. False (the default): plain dict chunks (the in-memory backend adopts them as its map).
    sorted_bulk_runs: ClassVar[bool] = False
    plugin_api: ClassVar[int] = PLUGIN_API_VERSION

    @classmethod
    def open(cls, directory: Path, options: Mapping[str, Any], *, store: str = "",
             partition: int | None = None) -> "KVBackend":
        """Open this backend for one store partition under ``directory/<name>``: each backend owns its
        own subdirectory, so switching backends never reads another format (the new one starts empty
        and is restored). ``options`` are the store's validated backend options."""
        return cls(Path(directory) / cls.name, options, store=store, partition=partition)  # type: ignore[call-arg]

    def __init__(self) -> None:
        self._iterators: "weakref.WeakSet[BackendIterator]" = weakref.WeakSet()
        self.closed = False

    # -- reads ---------------------------------------------------------------------------------
    @abstractmethod
    def get(self, key: bytes) -> bytes | None:
        """The value of ``key``, or None."""

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Values of ``keys`` in order (None where absent)."""
        return [self.get(k) for k in keys]

    @abstractmethod
    def get_meta(self, key: bytes) -> bytes | None:
        """A metadata value (stored apart from user data), or None."""

    @abstractmethod
    def approximate_count(self) -> int:
        """Estimated number of user keys."""

    @abstractmethod
    def _scan(self, start: bytes | None, end: bytes | None, after: bytes | None, reverse: bool,
              limit: int) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` live entries with ``start <= key < end`` (None = unbounded), strictly after
        ``after`` in iteration order (``after`` None: from the first), ascending or descending."""

    def scan(self, start: bytes | None, end: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` entries with ``start <= key < end`` in ascending key order, read in one call
        (a chunk of a long scan: resume with ``start`` just after the last key returned). Unlike
        :meth:`iterate` it takes no snapshot: the list is what the backend held at the call."""
        if self.closed:
            raise StoreClosedError(f"{self.name} backend is closed")
        return self._scan(start, end, None, False, limit)

    # -- writes --------------------------------------------------------------------------------
    def write(self, items: Collection[Item], meta: Mapping[bytes, bytes] | None = None, *,
              deletes: bool = True) -> None:
        """Apply puts/deletes and metadata atomically. ``items`` may be any re-iterable collection
        (a list, a dict's ``items()``); ``deletes=False`` promises that no value is None, which lets
        a backend take a bulk-put path."""
        if self.closed:
            raise StoreClosedError(f"{self.name} backend is closed")
        if self._iterators and items:
            self._preserve(items)
        try:
            self._write(items, meta or {}, deletes)
        except StoreError:
            raise
        except Exception as exc:  # RocksDB raises plain Exception, LMDB lmdb.Error subclasses
            typed = self.io_error(exc, "write to")
            if typed is None:
                raise
            raise typed from exc

    def io_error(self, exc: BaseException, action: str, *, only_resources: bool = False) -> StoreIOError | None:
        """A :class:`StoreIOError` naming this backend's files when ``exc`` is an OS error (disk full,
        read-only file system, permissions, ...), else None (the caller re-raises). With
        ``only_resources``, errors that may mean damaged local state (a missing file, EIO) are not
        classified, so that opening can still discard and rebuild a corrupt store."""
        # rocksdict raises OSError without errno ("Read-only file system (os error 30)"): read the text.
        code = (exc.errno if isinstance(exc, OSError) else None) or errno_in_text(str(exc))
        if code is None and str(exc).startswith("IO error"):
            code = errno.EIO  # a RocksDB I/O status without an OS reason ("Writer has previous error")
        if code is None or (only_resources and code not in RESOURCE_ERRNOS):
            return None
        path = getattr(self, "_path", None)
        return StoreIOError(f"cannot {action} the {self.name} store files at {path}: {exc}", errno=code,
                            hint=os_error_hint(code), store=getattr(self, "_store", None) or None,
                            partition=getattr(self, "_partition", None), path=str(path) if path else None)

    @abstractmethod
    def _write(self, items: Collection[Item], meta: Mapping[bytes, bytes], deletes: bool) -> None:
        """Backend-specific atomic write (``deletes``: whether some value may be None)."""

    def bulk_load(self, chunks: Iterable[Mapping[bytes, bytes | None]]) -> None:
        """Restore path: apply ``chunks`` (key -> value, None deletes) in order, each atomically, with
        no metadata change. Backends may skip per-chunk durability (the changelog holds the records),
        but everything loaded is durable when this returns. The chunks are handed over: a backend
        may keep or change a chunk dict (the caller builds a new one for each). Errors are typed as
        for :meth:`write`; errors raised by ``chunks`` itself (a damaged changelog) pass through
        unchanged."""
        if self.closed:
            raise StoreClosedError(f"{self.name} backend is closed")
        try:
            self._bulk_load(chunks)
        except LocalStateError:
            raise
        except Exception as exc:
            typed = self.io_error(exc, "write to")
            if typed is None:
                raise
            raise typed from exc

    def _bulk_load(self, chunks: Iterable[Mapping[bytes, bytes | None]]) -> None:
        """One :meth:`_write` per chunk, in key order when the backend asks for it (``sorted_writes``)."""
        for chunk in chunks:
            items: Collection[Item] = sorted_items(chunk) if self.sorted_writes else chunk.items()
            if self._iterators and items:
                self._preserve(items)
            self._write(items, {}, has_deletes(chunk))

    def _runs(self, chunks: Iterable[Mapping[bytes, bytes | None]]) -> Iterator[dict[bytes, bytes | None]]:
        """Consecutive ``chunks`` merged (later values win) into runs of at least :attr:`bulk_run_keys`
        keys (the last one may be smaller): for backends whose bulk write costs per call, not per key.
        A chunk that is a run by itself (the restore path's) is passed on as it is, not copied: the
        run belongs to the backend. Open iterators get the pre-images first, as for :meth:`write`."""
        limit = self.bulk_run_keys
        run: dict[bytes, bytes | None] = {}
        for chunk in chunks:
            if self._iterators and chunk:
                self._preserve(chunk.items())
            if isinstance(chunk, SortedRun):  # coalesced and sorted already: never merged into a dict
                if run:
                    yield run
                    run = {}
                yield chunk
                continue
            if not run and len(chunk) >= limit and type(chunk) is dict:
                yield chunk
                continue
            run.update(chunk)
            if len(run) >= limit:
                yield run
                run = {}
        if run:
            yield run

    @abstractmethod
    def clear(self) -> None:
        """Remove all data and metadata (used when local state is unusable)."""

    def discard(self) -> None:
        """Throw local state away, even when it is too damaged to :meth:`clear` in place."""
        self.clear()

    def corruption(self, exc: BaseException) -> StoreCorruptError | None:
        """If ``exc`` (raised by the backend library) reports damaged local data: mark the backend's
        directory corrupt (see :mod:`localstate.core.corruption`) and return the error to raise."""
        return None

    # -- iteration -----------------------------------------------------------------------------
    def iterate(self, start: bytes | None, end: bytes | None, reverse: bool = False) -> "BackendIterator":
        """A snapshot iterator over ``[start, end)`` yielding ``(key, value)``."""
        if self.closed:
            raise StoreClosedError(f"{self.name} backend is closed")
        iterator = BackendIterator(self, start, end, reverse)
        self._iterators.add(iterator)
        return iterator

    def _preserve(self, items: Collection[Item]) -> None:
        """Before a write: give every open iterator the pre-image of keys it has not passed yet."""
        live = [it for it in list(self._iterators) if not it.closed]
        if not live:
            return
        keys = list({k for k, _ in items})
        wanted: dict[bytes, list[BackendIterator]] = {}
        for it in live:
            for k in keys:
                if it.wants(k):
                    wanted.setdefault(k, []).append(it)
        if not wanted:
            return
        order = list(wanted)
        for k, old in zip(order, self.get_many(order)):
            for it in wanted[k]:
                it.overlay[k] = old

    # -- lifecycle -----------------------------------------------------------------------------
    def close(self) -> None:
        """Close open iterators and release the backend. Idempotent."""
        if self.closed:
            return
        for it in list(self._iterators):
            it.close()
        self._iterators = weakref.WeakSet()
        self.closed = True
        try:
            self._close()
        except StoreError:
            raise
        except Exception as exc:  # RocksDB flushes its memtable on close: a full disk fails it
            typed = self.io_error(exc, "close")
            if typed is None:
                raise
            raise typed from exc

    @abstractmethod
    def _close(self) -> None:
        """Release backend handles."""


class DirectoryBackend(KVBackend):
    """A backend whose local state is a library's files in one directory (RocksDB, LMDB).

    Opening is one template (:meth:`_open`): a directory marked corrupt (see
    :mod:`localstate.core.corruption`) is wiped first; then :meth:`_connect` opens the library. If
    that fails, a resource problem (disk full, read-only, permissions) raises :class:`StoreIOError`
    and a lock held elsewhere (:meth:`_in_use_error`) raises :class:`StoreError`: both keep the local
    state. Only damage (:meth:`_is_damage`) wipes the directory, with a warning, and opens it empty:
    the runtime then rebuilds the store from the changelog. Subclasses implement only
    :meth:`_connect`, :meth:`_release` and the two classification hooks.
    """

    #: The library's name in messages ("RocksDB").
    label: ClassVar[str] = ""

    def __init__(self, path: Path, *, store: str = "", partition: int | None = None) -> None:
        super().__init__()
        self._path = Path(path)
        self._store = store
        self._partition = partition

    @abstractmethod
    def _connect(self) -> None:
        """Open the library on ``self._path`` (an existing, possibly empty directory) and set the
        handles; on failure, leave no handle open."""

    @abstractmethod
    def _release(self) -> None:
        """Drop the library's handles (before the files are wiped or on close)."""

    def _is_damage(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised by :meth:`_connect` and neither a resource nor a lock problem,
        means the files are damaged (wipe and start empty) rather than a bug to report."""
        return True

    def _in_use_error(self, exc: BaseException) -> StoreError | None:
        """The error to raise when ``exc`` says another process or handle holds the files, else None."""
        return None

    def _open(self) -> None:
        """Open the directory's files, wiping them first when marked corrupt or found damaged. A
        symlink there is refused (UnsafePathError) before anything is opened: the library would
        follow it."""
        check_tree_no_symlinks(self._path)
        reason = corrupt_reason(self._path)
        if reason is not None:
            self._wipe(f"found damaged earlier: {reason}")
        try:
            self._path.mkdir(parents=True, exist_ok=True)
            self._connect_or_wipe()
        except StoreError:
            raise
        except Exception as exc:  # RocksDB raises plain Exception, LMDB lmdb.Error subclasses, OSError
            typed = self.io_error(exc, "open")
            if typed is None:
                raise
            raise typed from exc

    def _connect_or_wipe(self) -> None:
        try:
            self._connect()
        except Exception as exc:
            if self.io_error(exc, "open", only_resources=True) is not None:
                raise  # disk full, read-only, permissions: not damage, so keep the local state
            in_use = self._in_use_error(exc)
            if in_use is not None:
                raise in_use from exc
            if not self._is_damage(exc):
                raise
            # Unreadable local state is only a cache of the changelog: start empty and be restored.
            self._wipe(f"cannot open it: {str(exc)[:300]}")
            self._connect()

    def _wipe(self, reason: str | None) -> None:
        """Remove the directory's files and leave it empty (handles must already be released)."""
        wipe_local(self._path, self.label or self.name, reason, store=self._store, partition=self._partition)

    def clear(self) -> None:
        self.discard()

    def discard(self) -> None:
        """Release the handles, wipe the files (even when too damaged to clear in place) and reopen empty."""
        self._release()
        self._wipe(None)
        self._open()

    def _close(self) -> None:
        self._release()


_SORTING = load_native("localstate.native._sorting")


class SortedItems(Collection[tuple[bytes, Any]]):
    """The pairs of a :class:`SortedRun`, re-iterable, made one at a time from its two columns (no
    list of a million tuples to build, track and free)."""

    __slots__ = ("_keys", "_values")

    def __init__(self, keys: list[bytes], values: list[Any]) -> None:
        self._keys, self._values = keys, values

    def __iter__(self) -> Iterator[tuple[bytes, Any]]:
        return zip(self._keys, self._values)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, item: object) -> bool:
        return item in zip(self._keys, self._values)


class SortedRun(Mapping[bytes, Any]):
    """A run of a bulk load as two columns: ``key_column`` unique and in bytes order, and
    ``value_column`` (``value_column[i]`` belongs to ``key_column[i]``; None deletes the key). What
    the restore path hands backends whose bulk load writes in key order
    (:attr:`KVBackend.sorted_bulk_runs`); made by :func:`coalesce_sorted`, which also records the
    shortest and longest key (``key_sizes``), the bytes of all keys and values (``nbytes``) and the
    number of None values (``deletes``), so that checks and space estimates need no pass over a
    million objects. A read-only Mapping, so whatever takes a dict chunk takes it too; :meth:`items`
    and :meth:`values` cost no copy."""

    __slots__ = ("key_column", "value_column", "key_sizes", "nbytes", "deletes")

    def __init__(self, key_column: list[bytes], value_column: list[Any], key_sizes: tuple[int, int],
                 nbytes: int, deletes: int) -> None:
        self.key_column, self.value_column = key_column, value_column
        self.key_sizes, self.nbytes, self.deletes = key_sizes, nbytes, deletes

    def __getitem__(self, key: bytes) -> Any:
        at = bisect_left(self.key_column, key)
        if at == len(self.key_column) or self.key_column[at] != key:
            raise KeyError(key)
        return self.value_column[at]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.key_column)

    def __len__(self) -> int:
        return len(self.key_column)

    def items(self) -> SortedItems:  # type: ignore[override]
        return SortedItems(self.key_column, self.value_column)

    def values(self) -> list[Any]:  # type: ignore[override]
        return self.value_column


def coalesce_sorted(key_runs: list[list[bytes] | tuple[bytes, bytes]],
                    value_runs: list[list[Any] | None]) -> SortedRun:
    """Runs of changelog records in columns (record ``j`` of run ``i``: ``key_runs[i][j]`` ->
    ``value_runs[i][j]``, in log order) coalesced, the last value of each key winning, into one
    :class:`SortedRun`. A run may be framed (:attr:`RecordColumns.framed` as ``key_runs[i]``, None as
    ``value_runs[i]``): only the records kept become objects, made in key order. In C
    (``native/_sorting.c``: one stable radix sort of all the records, then the last of each key kept)
    when the extension is built and every key is exactly bytes; otherwise a dict and Python's sort,
    with the same result."""
    if _SORTING is not None:
        try:
            keys, values, shortest, longest, nbytes, deletes = _SORTING.coalesce_sorted(key_runs, value_runs)
            return SortedRun(keys, values, (shortest, longest), nbytes, deletes)
        except TypeError:  # a key that is not exactly bytes: Python's sort decides (or refuses)
            pass
    merged: dict[bytes, Any] = {}
    for keys, values in zip(key_runs, value_runs, strict=True):
        if isinstance(keys, tuple) and values is None:
            keys, values = split_spans(*keys)
        merged.update(zip(keys, values, strict=True))
    ordered = sorted(merged)
    values = [merged[k] for k in ordered]
    nbytes = sum(map(len, ordered)) + sum(len(v) for v in values if isinstance(v, bytes))  # as the C code
    return SortedRun(ordered, values, key_sizes(merged) if merged else (0, 0), nbytes, values.count(None))


def key_sizes(chunk: Mapping[bytes, Any]) -> tuple[int, int]:
    """The shortest and longest key of a non-empty bulk-load chunk (a :class:`SortedRun` knows them)."""
    if isinstance(chunk, SortedRun):
        return chunk.key_sizes
    sizes = list(map(len, chunk))
    return min(sizes), max(sizes)


def has_deletes(chunk: Mapping[bytes, Any]) -> bool:
    """Whether a bulk-load chunk deletes a key (a None value; a :class:`SortedRun` has counted them)."""
    if isinstance(chunk, SortedRun):
        return chunk.deletes > 0
    return None in chunk.values()


def payload_bytes(chunk: Mapping[bytes, Any]) -> int:
    """The bytes of a bulk-load chunk's keys and values (a :class:`SortedRun` knows them)."""
    if isinstance(chunk, SortedRun):
        return chunk.nbytes
    return sum(map(len, chunk)) + sum(map(len, filter(None, chunk.values())))


def sorted_items(run: Mapping[bytes, Any]) -> Collection[tuple[bytes, Any]]:
    """The items of ``run`` in key order (bytes order), as a re-iterable collection of pairs: what a
    sorted bulk write (an SST file, an LMDB append, a memtable insert from the previous position)
    takes.

    A :class:`SortedRun` is in key order already (its pairs are made as they are read); a dict of
    bytes keys is sorted in C (``native/_sorting.c``, 3-4 times faster) when the extension is built;
    otherwise ``sorted(run.items(), key=itemgetter(0))``, which compares the keys alone."""
    if isinstance(run, SortedRun):
        return run.items()
    if _SORTING is not None and type(run) is dict:
        try:
            return _SORTING.sorted_items(run)
        except TypeError:  # a key that is not exactly bytes: Python's sort decides (or refuses)
            pass
    return sorted(run.items(), key=itemgetter(0))


def prefix_end(prefix: bytes) -> bytes | None:
    """Smallest byte string greater than every string starting with ``prefix`` (None: no bound), the
    exclusive end of a prefix scan."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


class BackendIterator(Iterator[tuple[bytes, bytes]]):
    """Snapshot iterator over a backend's ``[start, end)``: live chunks corrected by an overlay of
    pre-images recorded when keys change after the iterator opened (None = key did not exist)."""

    __slots__ = ("_backend", "_start", "_end", "_reverse", "_buf", "_i", "_fetched", "_pos", "_done",
                 "_chunk", "overlay", "closed", "__weakref__")

    def __init__(self, backend: KVBackend, start: bytes | None, end: bytes | None, reverse: bool) -> None:
        self._backend = backend
        self._start = start
        self._end = end
        self._reverse = reverse
        self._buf: list[tuple[bytes, bytes]] = []
        self._i = 0
        self._fetched: bytes | None = None   # last live key fetched (resume point of the next chunk)
        self._pos: bytes | None = None       # last key yielded
        self._done = start is not None and end is not None and start >= end
        self._chunk = _FIRST_CHUNK
        self.overlay: SortedDict = SortedDict()
        self.closed = False

    def wants(self, key: bytes) -> bool:
        """Whether a change to ``key`` must be preserved for this iterator."""
        if key in self.overlay:
            return False
        if (self._start is not None and key < self._start) or (self._end is not None and key >= self._end):
            return False
        pos = self._pos
        if pos is None:
            return True
        return key < pos if self._reverse else key > pos

    def _refill(self) -> None:
        if self._backend.closed:
            raise StoreClosedError("the store was closed while an iterator was open",
                                   hint="finish or close iterators before closing the store")
        request = self._chunk
        chunk = self._backend._scan(self._start, self._end, self._fetched, self._reverse, request)
        # Small first chunks keep short scans cheap; big later ones keep long scans fast.
        self._chunk = min(request * 2, _MAX_CHUNK)
        self._buf = chunk
        self._i = 0
        if len(chunk) < request:
            self._done = True  # a short chunk: the live range is exhausted
        if chunk:
            self._fetched = chunk[-1][0]

    def _next_overlay(self) -> bytes | None:
        overlay = self.overlay
        if not overlay:
            return None
        pos = self._pos
        if self._reverse:
            keys = overlay.irange(maximum=pos, inclusive=(True, False), reverse=True) if pos is not None \
                else overlay.irange(reverse=True)
        else:
            keys = overlay.irange(minimum=pos, inclusive=(False, True)) if pos is not None else overlay.irange()
        return next(iter(keys), None)

    def __iter__(self) -> "BackendIterator":
        return self

    def __next__(self) -> tuple[bytes, bytes]:
        while True:
            if self.closed:
                raise StopIteration
            if self._i >= len(self._buf) and not self._done:
                self._refill()
            live = self._buf[self._i] if self._i < len(self._buf) else None
            if not self.overlay:
                if live is None:
                    self.close()
                    raise StopIteration
                self._i += 1
                self._pos = live[0]
                return live
            ov = self._next_overlay()
            if live is None and ov is None:
                self.close()
                raise StopIteration
            if ov is not None and (live is None or ov == live[0] or ((ov > live[0]) if self._reverse else (ov < live[0]))):
                if live is not None and ov == live[0]:
                    self._i += 1
                self._pos = ov
                old = self.overlay[ov]
                if old is None:
                    continue  # created after the iterator opened
                return ov, old
            assert live is not None
            self._i += 1
            self._pos = live[0]
            return live

    def close(self) -> None:
        """Release the iterator (idempotent). Holds no backend handle, so this only drops buffers."""
        if not self.closed:
            self.closed = True
            self._buf = []
            self.overlay = SortedDict()
            try:
                self._backend._iterators.discard(self)
            except TypeError:  # interpreter shutdown
                pass

    def __enter__(self) -> "BackendIterator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
