"""State TTL for the key-value engine (option ``ttl``): entries that expire, are never read again,
and are purged with changelog tombstones by a bounded sweep.

Stored format. A store with ``ttl`` keeps, in its changelog records and its backend, each value as
``expiry`` (8 bytes, a big-endian IEEE double: seconds since the epoch in the store's time domain)
followed by the serialized value. The expiry travels with the record, so a restore from the
changelog, a compacted changelog or an object-store snapshot brings back each entry's own deadline:
nothing expired becomes visible again. A store *without* ``ttl`` is the plain
:class:`~localstate.engines.kv.engine.KeyValueEngine`, unchanged.

Visibility. An entry is visible while ``now < expiry``, ``now`` read from the store's time source
(:attr:`StoreContext.time`) at each read: processing time (``ttl_time = "processing"``) or the
watermark (``"event"``; before the first watermark nothing expires, and a write then is stamped to
never expire until it is written again under a watermark). Every read path checks: ``get``,
``get_all``/``get_many``, ``merge_many``'s reads, ``range``/``prefix``/``all`` (iterators take ``now``
once, when they open).

Update type (``ttl_update``): ``on_write`` (Flink's OnCreateAndWrite): every put restarts the ttl;
``on_read_and_write``: a get of a live entry restarts it too, and logs the entry again.

Cleanup. Each flush first runs a sweep that examines at most ``ttl_sweep`` backend entries, from
where the previous sweep stopped (wrapping at the end of the key space), and deletes the expired
ones it finds, with a tombstone each in that flush's changelog records. The cost per commit is
bounded by ``ttl_sweep`` whatever the store's size; a full pass over ``n`` entries takes
``n / ttl_sweep`` flushes. A restore drops records already expired (every older record of their key
expired before them, time moving forward), and the state reader and ``localstate inspect`` filter
with :func:`live_entries`.

Cache. The object cache holds ``(value, expiry)`` pairs (None: known absent), so a cache hit checks
the deadline with no further lookup and memory stays bounded by ``cache_size``; the pending map holds
the stored bytes (expiry and value), ready for the changelog.
"""

from __future__ import annotations

import math
import struct
import time
from itertools import islice
from typing import Any, Callable, Iterable, Iterator, Mapping

from localstate.core.backend import SortedRun
from localstate.core.codecs import FAST_ERRORS
from localstate.core.engine import StoreContext
from localstate.core.time import EVENT_TIME, SystemTime, TimeSource
from localstate.engines.kv import engine as kv_engine
from localstate.engines.kv.engine import _MISS, KeyValueEngine, KVIterator, _NoClass
from localstate.errors import SerdeError

__all__ = ["TtlKeyValueEngine", "EXPIRY", "live_entries", "clock_of", "stamp", "NEVER"]

#: The expiry prefix of every stored value of a ttl store: a big-endian double, seconds.
EXPIRY = struct.Struct(">d")
_PACK, _UNPACK = EXPIRY.pack, EXPIRY.unpack_from
_WIDTH = EXPIRY.size
#: The expiry of an entry written in event time before the first watermark.
NEVER = math.inf


def clock_of(source: TimeSource, domain: str) -> Callable[[], float | None]:
    """The cheapest callable returning ``source``'s current time in ``domain`` (None: no time yet,
    nothing expires): ``time.time`` itself for the wall clock."""
    if domain == EVENT_TIME:
        return lambda: source.watermark
    if type(source) is SystemTime:
        return time.time
    return source.processing_time


def stamp(expiry: float, vb: bytes) -> bytes:
    """The stored form of serialized value ``vb`` expiring at ``expiry``."""
    return _PACK(expiry) + vb


def live_entries(options: Mapping[str, Any], source: TimeSource
                 ) -> Callable[[Iterable[tuple[bytes, bytes]]], Iterator[tuple[bytes, bytes]]] | None:
    """For the readers of committed or local state (the state reader, ``inspect``): a filter of a
    store's stored ``(key, value)`` pairs to the live ones, each value without its expiry prefix; None
    for a store without ``ttl`` (values stored as the serde made them)."""
    if options.get("ttl") is None:
        return None
    now = clock_of(source, options.get("ttl_time", "processing"))()

    def live(entries: Iterable[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
        for kb, vb in entries:
            if now is None or now < _UNPACK(vb)[0]:
                yield kb, vb[_WIDTH:]
    return live


class _LiveBackendIterator:
    """A backend iterator showing live entries only, without their expiry prefix."""

    def __init__(self, inner: Any, now: float | None) -> None:
        self._inner = inner
        self._now = now

    def __iter__(self) -> "_LiveBackendIterator":
        return self

    def __next__(self) -> tuple[bytes, bytes]:
        now = self._now
        for kb, vb in self._inner:
            if now is None or now < _UNPACK(vb)[0]:
                return kb, vb[_WIDTH:]
        raise StopIteration

    def close(self) -> None:
        self._inner.close()


class TtlKeyValueEngine(KeyValueEngine):
    """A :class:`KeyValueEngine` whose entries expire ``ttl`` seconds after they were last written (see
    the module docstring): same API and guarantees, plus ``now >= expiry`` reads as absent."""

    def __init__(self, context: StoreContext) -> None:
        options = context.options
        self._ttl = float(options["ttl"])
        self._domain = options.get("ttl_time", "processing")
        self._refresh_on_read = options.get("ttl_update", "on_write") == "on_read_and_write"
        self._sweep_limit = int(options.get("ttl_sweep", 1_000))
        self._now = clock_of(context.time, self._domain)
        self._sweep_from: bytes | None = None
        self.swept = 0
        """Expired entries the sweeps deleted since open (statistics)."""
        super().__init__(context)

    # -- time --------------------------------------------------------------------------------------
    def _expiry(self) -> float:
        """The expiry of an entry written now."""
        now = self._now()
        return NEVER if now is None else now + self._ttl

    def _entry(self, kb: bytes, stored: bytes) -> tuple[Any, float]:
        """``(value object, expiry)`` of a stored value."""
        vb = stored[_WIDTH:]
        try:
            value = self._vde_fast(vb)
        except FAST_ERRORS:
            value = self._decode_value(kb, vb)
        return value, _UNPACK(stored)[0]

    def _visible(self, entry: Any) -> Any:
        """The value of cache entry ``entry`` if it is live now, else None."""
        if entry is None:
            return None
        now = self._now()
        return entry[0] if now is None or now < entry[1] else None

    # -- the C fast paths ------------------------------------------------------------------------------
    def _bind_hot_path(self) -> None:
        """Values are held encoded with their expiry (never as int objects), and the C get/put run in
        their ttl mode (cache entries are pairs, the pending map holds stamped bytes)."""
        self._int_values = False
        self._hold_encoded = True
        native = kv_engine._HOTPATH
        if native is None or self._refresh_on_read:
            return  # reads that refresh write: the reference get does that
        cache = self._cache
        hot = native.TtlHotPath(young=cache.young, old=cache.old, dirty=self._dirty, key_class=self._key_class,
                                  batch=self._batch, spill=self._spill,
                                  reference_get=TtlKeyValueEngine.get.__get__(self), missed=self._get_missed,
                                  put_slow=TtlKeyValueEngine.put.__get__(self), vfast=self._vfast,
                                  slow_value=self._slow_value, errors=FAST_ERRORS, clock=self._now, ttl=self._ttl)
        self.get, self.put = hot.get, hot.put  # type: ignore[method-assign]

    # -- reads -------------------------------------------------------------------------------------
    def get(self, key: Any) -> Any:
        """The value of ``key`` if present and not expired, else None."""
        ckey = key if key.__class__ is self._key_class else self._canonical(key)
        entry = self._cache.young.get(ckey, _MISS)
        if entry is _MISS:
            entry = self._get_missed(ckey)
        value = self._visible(entry)
        if value is not None and self._refresh_on_read:
            self.put(key, value)
        return value

    def _get_missed(self, ckey: Any) -> Any:
        """The cache entry of ``ckey`` after a miss in the young generation (None: absent), looked up
        as :meth:`KeyValueEngine._get_missed` does and cached."""
        cache = self._cache
        entry = cache.old.pop(ckey, _MISS)
        if entry is not _MISS:
            cache.young[ckey] = entry
            return entry
        held = self._dirty.get(ckey, _MISS)
        if held is not _MISS:
            entry = None if held is None else self._entry(self._key_bytes(ckey), held)
            cache.insert(ckey, entry)
            return entry
        kb = self._key_bytes(ckey)
        if not self._min_key <= len(kb) <= self._max_key:
            return None
        vb = _MISS
        if self._inflight:
            vb = self._inflight.get(ckey, _MISS)
            if vb is _MISS and not self._backend.concurrent_reads:
                self._settle()
        if vb is _MISS:
            try:
                vb = self._backend.get(kb)
            except Exception as exc:
                raise self._backend_failed(exc) from exc
        entry = None if vb is None else self._entry(kb, vb)
        cache.insert(ckey, entry)
        return entry

    def get_all(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """Values of ``keys`` as a dict; absent and expired keys are left out."""
        keys = list(keys)
        return {key: value for key, value in zip(keys, self.get_many(keys)) if value is not None}

    def get_many(self, keys: Iterable[Any]) -> list[Any]:
        """The values of ``keys``, in order (None: absent or expired)."""
        values = super().get_many(keys)
        if self._refresh_on_read:
            keys = keys if isinstance(keys, list) else list(keys)
            live = [(key, value) for key, value in zip(keys, values) if value is not None]
            if live:
                self.put_many([key for key, _ in live], [value for _, value in live])
        return values

    def _lookup_many(self, ckeys: list[Any]) -> list[Any]:
        entries = list(map(self._cache.young.get, ckeys, [_MISS] * len(ckeys)))
        missed = [i for i, entry in enumerate(entries) if entry is _MISS]
        if missed:
            found = self._get_missed_many(list(dict.fromkeys([ckeys[i] for i in missed])))
            for i in missed:
                entries[i] = found[ckeys[i]]
        now = self._now()
        if now is None:
            return [None if entry is None else entry[0] for entry in entries]
        return [None if entry is None or now >= entry[1] else entry[0] for entry in entries]

    def _get_missed_many(self, ckeys: list[Any]) -> dict[Any, Any]:
        # one backend read for the keys neither cached nor pending (as the base class), as entries
        found: dict[Any, Any] = {}
        fetch: list[tuple[Any, bytes]] = []
        for ckey in ckeys:
            if ckey in self._cache.old or ckey in self._dirty or self._inflight:
                found[ckey] = self._get_missed(ckey)
                continue
            kb = self._key_bytes(ckey)
            if not self._min_key <= len(kb) <= self._max_key:
                found[ckey] = None
            else:
                fetch.append((ckey, kb))
        if fetch:
            try:
                stored = self._backend.get_many([kb for _, kb in fetch])
            except Exception as exc:
                raise self._backend_failed(exc) from exc
            for (ckey, kb), vb in zip(fetch, stored):
                entry = None if vb is None else self._entry(kb, vb)
                self._cache.insert(ckey, entry)
                found[ckey] = entry
        return found

    # -- writes --------------------------------------------------------------------------------------
    def put(self, key: Any, value: Any) -> None:
        """Set ``key`` to ``value`` (not None), expiring ``ttl`` from now."""
        if value is None:
            raise self._none_value(key)
        young = self._cache.young
        if key.__class__ is self._key_class and key in young:
            ckey = key
            vb = self._held_value(key, value)
            expiry = self._expiry()
            young[ckey] = (value, expiry)
        else:
            ckey, _ = self._checked_key(key)
            vb = self._held_value(key, value)
            expiry = self._expiry()
            self._cache.insert(ckey, (value, expiry))
        dirty = self._dirty
        dirty[ckey] = _PACK(expiry) + vb
        if len(dirty) > self._batch:
            self._spill()

    def _held_many(self, latest: dict[Any, Any]) -> dict[Any, Any]:
        """The stamped bytes of each value of a checked batch (all expiring ``ttl`` from now)."""
        held = super()._held_many(latest)  # the values' bytes (checked: _hold_encoded is set)
        prefix = _PACK(self._expiry())
        return {ckey: prefix + vb for ckey, vb in held.items()}

    def _apply(self, latest: dict[Any, Any], held: dict[Any, Any]) -> None:
        cache = self._cache
        for ckey, value in latest.items():
            cache.insert(ckey, (value, _UNPACK(held[ckey])[0]))
        dirty = self._dirty
        dirty.update(held)
        if len(dirty) > self._batch:
            self._spill()

    # -- iteration ---------------------------------------------------------------------------------------
    def _iterate(self, start: bytes | None, end: bytes | None, reverse: bool) -> KVIterator:
        """Live entries only, as of ``now`` when the iterator opens (a pending expired value hides the
        key, as a pending delete does)."""
        self._settle()
        now = self._now()
        if (start is not None and end is not None and start >= end) or not self._dirty:
            pending: list[tuple[bytes, bytes | None]] = []
        else:
            pending = [(k, None if v is None or (now is not None and now >= _UNPACK(v)[0]) else v[_WIDTH:])
                       for k, v in self._pending_items()[1]
                       if (start is None or k >= start) and (end is None or k < end)]
            if reverse:
                pending.reverse()
        backend = _LiveBackendIterator(self._backend.iterate(start, end, reverse), now)
        iterator = KVIterator(self, pending, backend, reverse)  # type: ignore[arg-type]
        self._iterators.add(iterator)
        return iterator

    # -- restore and flush -------------------------------------------------------------------------------
    def _prepare_restored(self, chunk: Mapping[bytes, bytes | None]) -> Mapping[bytes, bytes | None]:
        """As the base class, less the records already expired: their key's older records expired
        before them (time moves forward), so none can become visible; the sweep deletes what local
        state still holds of them."""
        chunk = super()._prepare_restored(chunk)
        now = self._now()
        if now is None or not chunk:
            return chunk
        values = chunk.values()
        self._check_stamped(values)
        if all(v is None or now < _UNPACK(v)[0] for v in values):
            return chunk
        kept = {k: v for k, v in chunk.items() if v is None or now < _UNPACK(v)[0]}
        if isinstance(chunk, SortedRun):
            keys = list(kept)
            sizes = (min(map(len, keys)), max(map(len, keys))) if keys else (0, 0)
            return SortedRun(keys, list(kept.values()), sizes,
                             sum(map(len, keys)) + sum(len(v) for v in kept.values() if v is not None),
                             sum(1 for v in kept.values() if v is None))
        return kept

    def _check_stamped(self, values: Iterable[bytes | None]) -> None:
        for vb in values:
            if vb is not None and len(vb) < _WIDTH:
                raise SerdeError(
                    f"store {self._store!r} has ttl but its changelog holds a {len(vb)}-byte value without "
                    f"an expiry: the store was written without ttl",
                    hint=f"adding or removing ttl changes how store {self._store!r} is stored: reset the "
                         f"store's state (`localstate reset`) or give the ttl store a new name",
                    **self._ctx())

    def flush(self) -> None:
        """Sweep (see :meth:`sweep`), then flush as the base class: the sweep's tombstones are logged
        with this flush's changes."""
        self.sweep()
        super().flush()

    def sweep(self, limit: int | None = None) -> int:
        """Delete the expired entries among the next ``limit`` (default ``ttl_sweep``) entries of the
        backend, from where the previous sweep stopped (wrapping at the end): a tombstone each,
        logged at the next flush. Returns how many it deleted."""
        now = self._now()
        if now is None:
            return 0
        limit = self._sweep_limit if limit is None else limit
        self._settle()
        dirty, cache = self._dirty, self._cache
        iterator = self._backend.iterate(self._sweep_from, None, False)
        examined = 0
        expired: list[bytes] = []
        last: bytes | None = None
        try:
            for kb, vb in islice(iterator, limit):
                examined += 1
                last = kb
                if now >= _UNPACK(vb)[0]:
                    expired.append(kb)
        finally:
            iterator.close()
        self._sweep_from = None if examined < limit or last is None else last + b"\x00"
        deleted = 0
        if expired:
            for ckey in (self._cache_keys(expired) if self._key_class is not _NoClass else expired):
                if ckey in dirty:
                    continue  # a pending write or delete supersedes the stored entry
                dirty[ckey] = None
                cache.discard(ckey)
                deleted += 1
            if deleted:
                self._tombstones = True
        self.swept += deleted
        return deleted
