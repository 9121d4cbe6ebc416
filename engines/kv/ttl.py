"""State TTL for the key-value engine (option ``ttl``): entries that expire, are never read again,
and are purged with changelog tombstones by a bounded sweep.

Stored format. A store with ``ttl`` keeps, in its changelog records and its backend, each value as
``expiry`` (8 bytes, a big-endian IEEE double: seconds since the epoch in the store's time domain)
followed by the serialized value. The expiry travels with the record, so a restore from the
changelog, a compacted changelog or an object-store snapshot brings back each entry's own deadline:
nothing expired becomes visible again. A store *without* ``ttl`` is the plain
:class:`~localstate.engines.kv.engine.KeyValueEngine`, unchanged.

Time. The store reads its time source (:attr:`StoreContext.time`, processing time or, with
``ttl_time = "event"``, the watermark) at open, at a restore, at every flush and when the runtime
starts a batch (``refresh_time``, the ``core.engine.TimedStore`` capability), i.e. once per commit, as Spark's transformWithState judges TTL by its micro-batch's timestamp: between two commits
the store's time stands still. An entry written in a commit interval expires ``ttl`` after the time
read at the interval's start; it is visible while that store time is before its expiry. (Reading a
clock per access would cost more than the whole cached get.) In event time, before the first
watermark nothing expires, and what is written then counts from the first watermark the store reads.

Visibility. Every read path checks the expiry against the store time: ``get``, ``get_all`` and
``get_many``, ``merge_many``'s reads, ``range``/``prefix``/``all`` and their iterators.

Update type (``ttl_update``): ``on_write`` (Flink's OnCreateAndWrite): every put restarts the ttl;
``on_read_and_write``: a get of a live entry restarts it too, and logs the entry again.

Cleanup. Each flush first runs a sweep that examines at most ``ttl_sweep`` backend entries, from
where the previous sweep stopped (wrapping at the end of the key space), and deletes the expired
ones it finds, with a tombstone each in that flush's changelog records. The cost per commit is
bounded by ``ttl_sweep`` whatever the store's size; a full pass over ``n`` entries takes
``n / ttl_sweep`` flushes. A complete pass also learns a lower bound of every stored expiry (the
horizon), before which the sweep examines nothing. A restore drops records already expired (every
older record of their key expired before them, time moving forward), and the state reader and
``localstate inspect`` filter with :func:`live_entries`.

Cache. Cached values stay plain objects, as without ttl; the cache keeps the expiry of each cached
value beside it (:class:`ExpiringCache`, bounded with the cache), so a put costs one more dict store;
a cache hit checks that expiry only when the store time has reached the cache's floor, a lower bound
of every expiry cached (judged once per refresh, see :meth:`TtlKeyValueEngine._cache_live`). The pending map holds values as without ttl: every pending
value of a commit interval shares the interval's expiry, stamped on all of them at the flush.
"""

from __future__ import annotations

import math
import struct
import time
from collections import deque
from itertools import islice, repeat
from typing import Any, Callable, Iterable, Iterator, Mapping

from localstate.core.backend import SortedRun
from localstate.core.codecs import FAST_ERRORS, INT_BIAS
from localstate.core.engine import StoreContext
from localstate.core.time import EVENT_TIME, SystemTime, TimeSource
from localstate.engines.kv import engine as kv_engine
from localstate.engines.kv.cache import GenerationalCache
from localstate.engines.kv.engine import _MISS, INT_MAX, INT_MIN, KeyValueEngine, KVIterator, _NoClass
from localstate.errors import ConfigError

__all__ = ["TtlKeyValueEngine", "ExpiringCache", "EXPIRY", "NEVER", "live_entries", "clock_of", "split_stored"]

#: The expiry prefix of every stored value of a ttl store: a big-endian double, seconds.
EXPIRY = struct.Struct(">d")
_PACK, _UNPACK = EXPIRY.pack, EXPIRY.unpack_from
_WIDTH = EXPIRY.size
#: A stored value of the int serde (held as ints, see KeyValueEngine): expiry and biased value in one
#: struct, so a miss unpacks it in one call; the flush packs it as (packed expiry, value) in one call
#: (the packed expiry is shared, which packs faster than a double per value).
_STAMPED_INT = struct.Struct(">dQ")
_STAMP_INT = struct.Struct(">8sQ").pack
#: The expiry of what is written in event time before the first watermark (until restamped).
NEVER = math.inf


def _stamped(stored: bytes) -> bool:
    """Whether ``stored`` starts with a plausible expiry: never (+inf), or seconds since the epoch up
    to year 33658 (a value written without ttl reads as a huge, tiny, negative or NaN double)."""
    if len(stored) < _WIDTH:
        return False
    expiry = _UNPACK(stored)[0]
    return expiry == NEVER or 1e-6 <= expiry <= 1e12


def clock_of(source: TimeSource, domain: str) -> Callable[[], float | None]:
    """A callable returning ``source``'s current time in ``domain`` (None: no time yet, nothing
    expires)."""
    if domain == EVENT_TIME:
        return lambda: source.watermark
    if type(source) is SystemTime:
        return time.time
    return source.processing_time


def split_stored(data: bytes) -> tuple[bytes, float]:
    """A ttl store's stored value: ``(the serde's bytes, expiry)``."""
    return data[_WIDTH:], _UNPACK(data)[0]


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


class ExpiringCache(GenerationalCache):
    """The object cache of a ttl store: :class:`GenerationalCache` plus ``expiry``, the expiry of each
    cached value (cached Nones, known absences, need none), forgotten with its entry (rotation,
    discard, clear), so it stays bounded with the cache."""

    __slots__ = ("expiry",)

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.expiry: dict[Any, float] = {}

    def rotate(self) -> None:
        old = self.old
        # what the rotation drops (the old generation, else the young one's first-inserted half): their
        # expiries forgotten first, in one C-level pass without a copy of the keys
        dropped = old if old else islice(self.young, len(self.young) // 2)
        deque(map(self.expiry.pop, dropped, repeat(None)), maxlen=0)
        super().rotate()

    def discard(self, key: Any) -> None:
        super().discard(key)
        self.expiry.pop(key, None)

    def clear(self) -> None:
        super().clear()
        self.expiry.clear()


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
    the module docstring): same API and guarantees, plus an expired entry reads as absent."""

    state_format = "kv+ttl"
    """every stored and logged value starts with its 8-byte expiry"""

    _cache_class = ExpiringCache
    _cache: ExpiringCache

    def __init__(self, context: StoreContext) -> None:
        options = context.options
        self._ttl = float(options["ttl"])
        self._refresh_on_read = options.get("ttl_update", "on_write") == "on_read_and_write"
        self._sweep_limit = int(options.get("ttl_sweep", 1_000))
        self._clock = clock_of(context.time, options.get("ttl_time", "processing"))
        self._sweep_from: bytes | None = None
        # the sweep's horizon (see sweep): -inf, unknown, until a pass over the whole store completes
        self._horizon = -math.inf
        self._pass_start, self._pass_min = -math.inf, NEVER
        self._hot: Any = None
        self._now: float | None = None
        self._write_expiry = NEVER
        # the cache's floor (see _cache_live): a lower bound of every expiry it has held since the
        # floor was last computed; _all_live: every cached value is live at the store time
        self._floor, self._all_live = NEVER, True
        self._recheck_every, self._recheck_in = 1, 0
        self.swept = 0
        """Expired entries the sweeps deleted since open (statistics)."""
        self.examined = 0
        """Stored entries the sweeps examined since open (statistics)."""
        super().__init__(context)
        try:
            self._check_local_state()
        except BaseException:
            self.close()  # release the backend (its lock) before the error leaves the constructor
            raise
        self.refresh_time()

    # -- time --------------------------------------------------------------------------------------
    def refresh_time(self) -> None:
        """Read the time source: the store's time until the next refresh (each flush and restore does
        one; a task or test may call it to move the store's time between commits). Pending writes of
        the ending interval are spilled first (logged with its expiry), as every pending value must
        share one expiry; but what was written while there was no time yet (event time before the
        first watermark) counts from the first time read."""
        now = self._clock()
        was_timeless = self._now is None
        write_expiry = NEVER if now is None else now + self._ttl
        if self._dirty and not was_timeless and write_expiry != self._write_expiry:
            self._spill()
        self._now = None if now is None else float(now)
        self._write_expiry = write_expiry
        if was_timeless and now is not None and self._dirty:
            expiry = self._cache.expiry
            for ckey in self._dirty.keys() & expiry.keys():
                expiry[ckey] = write_expiry
        self._all_live = self._cache_live(self._now)
        self._floor = min(self._floor, write_expiry)
        if self._hot is not None:
            self._hot.set_time(self._now, self._write_expiry, self._all_live)

    def _cache_live(self, now: float | None) -> bool:
        """Whether every value cached now is live at ``now`` (then a cache hit needs no expiry
        check until the next refresh: what a miss caches in the interval is live at ``now``, and what
        a put caches expires at the write expiry, later). Judged by the floor, a lower bound of every
        expiry the cache has held since it was last computed; when ``now`` has reached it, it is
        computed again from the cache's expiries, but after a computation that finds an expired entry
        still cached, only every 2nd, 4th, ... 64th refresh (the entry may stay cached for long, and
        the per-hit check is what the cache then needs anyway)."""
        if now is None or now < self._floor:
            return True
        if self._recheck_in > 0:
            self._recheck_in -= 1
            return False
        self._floor = min(self._cache.expiry.values(), default=NEVER)
        if now < self._floor:
            self._recheck_every = 1
            return True
        self._recheck_every = min(2 * self._recheck_every, 64)
        self._recheck_in = self._recheck_every - 1
        return False

    @property
    def store_time(self) -> float | None:
        """The store's current time (read at the last open, restore or flush; None: none yet)."""
        return self._now

    def _live(self, ckey: Any, value: Any) -> Any:
        """``value`` (cached under ``ckey``) if it is live at the store time, else None."""
        now = self._now
        if value is None or self._all_live or now is None or now < self._cache.expiry.get(ckey, NEVER):
            return value
        return None

    # -- the C fast paths ------------------------------------------------------------------------------
    def _bind_hot_path(self) -> None:
        """The C get/put in their ttl mode (``TtlHotPath``: the expiry checked on a cache hit, set on a
        put), when built; a store whose reads refresh the ttl keeps the reference get/put (a read
        writes)."""
        native = kv_engine._HOTPATH
        if native is None or self._refresh_on_read:
            return
        cache = self._cache
        self._hot = native.TtlHotPath(
            young=cache.young, old=cache.old, dirty=self._dirty, expiry=cache.expiry, key_class=self._key_class,
            batch=self._batch, spill=self._spill, reference_get=TtlKeyValueEngine.get.__get__(self),
            missed=self._get_missed, put_slow=TtlKeyValueEngine.put.__get__(self), int_values=self._int_values,
            int_min=INT_MIN, int_max=INT_MAX, vfast=self._vfast, slow_value=self._slow_value, errors=FAST_ERRORS,
            hold_encoded=self._hold_encoded)
        self._hot.set_time(self._now, self._write_expiry, self._all_live)
        self.get, self.put = self._hot.get, self._hot.put  # type: ignore[method-assign]

    # -- reads -------------------------------------------------------------------------------------
    def get(self, key: Any) -> Any:
        """The value of ``key`` if present and live at the store time, else None."""
        ckey = key if key.__class__ is self._key_class else self._canonical(key)
        value = self._cache.young.get(ckey, _MISS)
        if value is _MISS:
            value = self._get_missed(ckey)
        value = self._live(ckey, value)
        if value is not None and self._refresh_on_read:
            self.put(key, value)
        return value

    def _get_missed(self, ckey: Any) -> Any:
        """As :meth:`KeyValueEngine._get_missed`, reading stamped values and caching their expiry; an
        expired stored value reads (and is cached) as None."""
        cache = self._cache
        value = cache.old.pop(ckey, _MISS)
        if value is not _MISS:
            cache.young[ckey] = value
            return value
        held = self._dirty.get(ckey, _MISS)
        if held is not _MISS:  # written in this commit interval: live, expiring with the interval
            if held is not None and self._decode_held is not None:
                held = self._decode_pending(ckey, held)
            cache.insert(ckey, held)
            if held is not None and ckey in cache.young:
                cache.expiry[ckey] = self._write_expiry
            return held
        if self._key_class is _NoClass:  # as _key_bytes, inline (every miss of the C get comes here)
            kb = ckey
        else:
            try:
                kb = self._kfast(ckey)
            except FAST_ERRORS:
                kb = self._slow_key(ckey)
        if not self._min_key <= len(kb) <= self._max_key:
            return None
        vb = self._stored_bytes(ckey, kb)
        if vb is None:
            cache.insert(ckey, None)
            return None
        if self._int_values and len(vb) == 16:
            expiry, value = _STAMPED_INT.unpack(vb)
            value -= INT_BIAS
        else:
            expiry, = _UNPACK(vb)
            value = _MISS
        now = self._now
        if now is not None and now >= expiry:
            cache.insert(ckey, None)
            return None
        if value is _MISS:
            vb = vb[_WIDTH:]
            try:
                value = self._vde_fast(vb)
            except FAST_ERRORS:
                value = self._decode_value(kb, vb)
        if cache.size:  # insert puts it in the young generation
            cache.insert(ckey, value)
            cache.expiry[ckey] = expiry
            if expiry < self._floor:
                self._floor = expiry
        return value

    def get_all(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """Values of ``keys`` as a dict; absent and expired keys are left out."""
        keys = list(keys)
        return {key: value for key, value in zip(keys, self.get_many(keys)) if value is not None}

    def get_many(self, keys: Iterable[Any]) -> list[Any]:
        """The values of ``keys``, in order (None: absent or expired)."""
        keys = keys if isinstance(keys, list) else list(keys)
        values = super().get_many(keys)
        if self._refresh_on_read:
            live = [(key, value) for key, value in zip(keys, values) if value is not None]
            if live:
                self.put_many([key for key, _ in live], [value for _, value in live])
        return values

    def _lookup_many(self, ckeys: list[Any]) -> list[Any]:
        values = super()._lookup_many(ckeys)
        now = self._now
        if now is None or self._all_live:
            return values
        expiry = self._cache.expiry
        return [None if value is None or now >= expiry.get(ckey, NEVER) else value
                for ckey, value in zip(ckeys, values)]

    def _get_missed_many(self, ckeys: list[Any]) -> dict[Any, Any]:
        # the misses of a batched read, one at a time (the reference: a batched read of a ttl store
        # needs each stored value's expiry)
        return {ckey: self._get_missed(ckey) for ckey in ckeys}

    # -- writes --------------------------------------------------------------------------------------
    def put(self, key: Any, value: Any) -> None:
        """Set ``key`` to ``value`` (not None), expiring ``ttl`` after the store time."""
        KeyValueEngine.put(self, key, value)
        ckey = key if key.__class__ is self._key_class else self._canonical(key)
        if ckey in self._cache.young:
            self._cache.expiry[ckey] = self._write_expiry

    def _apply(self, latest: dict[Any, Any], held: dict[Any, Any]) -> None:
        super()._apply(latest, held)
        young, expiry, when = self._cache.young, self._cache.expiry, self._write_expiry
        for ckey in latest:
            if ckey in young:
                expiry[ckey] = when

    def _pending_items(self) -> tuple[list[Any], list[tuple[bytes, bytes | None]]]:
        """The pending changes as :meth:`KeyValueEngine._pending_items` encodes them, each value stamped
        with the commit interval's expiry (every pending value was written in it)."""
        if self._int_values and not self._tombstones:  # ints held as objects: pack and stamp at once
            dirty = self._dirty
            ckeys = sorted(dirty)
            native = kv_engine._HOTPATH
            if native is not None:  # in C: one allocation per value, no tuple or bound call between
                try:
                    stamped = native.stamp_ints(self._write_expiry, list(map(dirty.__getitem__, ckeys)))
                except (TypeError, OverflowError):
                    pass  # a held value that is no exact int in range: the reference below encodes
                else:
                    return ckeys, list(zip(self._encode_keys(ckeys), stamped))
            values = map(INT_BIAS.__add__, map(dirty.__getitem__, ckeys))
            return ckeys, list(zip(self._encode_keys(ckeys), map(_STAMP_INT, repeat(_PACK(self._write_expiry)),
                                                                  values)))
        ckeys, kbs, vbs = self._pending_columns()
        stamp = _PACK(self._write_expiry).__add__
        if self._tombstones:
            stamped = [None if vb is None else stamp(vb) for vb in vbs]
        else:
            stamped = list(map(stamp, vbs))
        return ckeys, list(zip(kbs, stamped))

    # -- iteration ---------------------------------------------------------------------------------------
    def _iterate(self, start: bytes | None, end: bytes | None, reverse: bool) -> KVIterator:
        """Live entries only, at the store time (pending values are all live: written at it)."""
        self._settle()
        now = self._now
        if (start is not None and end is not None and start >= end) or not self._dirty:
            pending: list[tuple[bytes, bytes | None]] = []
        else:
            pending = [(k, None if v is None else v[_WIDTH:]) for k, v in self._pending_items()[1]
                       if (start is None or k >= start) and (end is None or k < end)]
            if reverse:
                pending.reverse()
        backend = _LiveBackendIterator(self._backend.iterate(start, end, reverse), now)
        iterator = KVIterator(self, pending, backend, reverse)  # type: ignore[arg-type]
        self._iterators.add(iterator)
        return iterator

    # -- restore and flush -------------------------------------------------------------------------------
    def restore(self, records: Iterable[Any]) -> None:
        self._restoring()
        super().restore(records)

    def restore_columns(self, columns: Iterable[Any]) -> None:
        self._restoring()
        super().restore_columns(columns)

    def _restoring(self) -> None:
        """Before a restore: read the time (expired records are skipped), and forget the sweep's
        horizon (restored entries may expire before it)."""
        self.refresh_time()
        self._horizon, self._sweep_from = -math.inf, None

    def _prepare_restored(self, chunk: Mapping[bytes, bytes | None]) -> Mapping[bytes, bytes | None]:
        """As the base class, less the records already expired: their key's older records expired
        before them (time moves forward), so none can become visible; the sweep deletes what local
        state still holds of them."""
        chunk = super()._prepare_restored(chunk)
        if not chunk:
            return chunk
        values = chunk.values()
        self._check_stamped(values)
        now = self._now
        if now is None or all(v is None or now < _UNPACK(v)[0] for v in values):
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
        """ConfigError when a stored value carries no plausible expiry: the store's state was written
        without ttl (adding or removing ttl changes the stored format)."""
        for vb in values:
            if vb is not None and not _stamped(vb):
                raise ConfigError.at(
                    f"stores.{self._store}.ttl",
                    f"store {self._store!r} (partition {self._partition}) has ttl, but its state holds a "
                    f"value written without ttl ({vb[:16]!r}): adding or removing ttl changes how the "
                    f"store's values are stored",
                    hint=f"start store {self._store!r} over (`localstate reset`, or a new store name), or "
                         f"remove ttl again")

    def _check_local_state(self) -> None:
        """At open: the first stored entry must carry an expiry (local state written without ttl is
        refused as the changelog's would be)."""
        if self._backend.approximate_count() == 0:
            return  # nothing stored (and a memory backend builds no key index for nothing)
        iterator = self._backend.iterate(None, None, False)
        try:
            first = next(iterator, None)
        finally:
            iterator.close()
        if first is not None:
            self._check_stamped([first[1]])

    def flush(self) -> None:
        """Sweep (see :meth:`sweep`), flush as the base class (the sweep's tombstones are logged with
        this commit's changes, every value stamped with the interval's expiry), then read the time
        source for the next interval."""
        if self._now is None:
            self.refresh_time()  # event time: the first watermark, if one came during the interval
        self.sweep()
        super().flush()
        self.refresh_time()

    def sweep(self, limit: int | None = None) -> int:
        """Delete the expired entries among the next ``limit`` (default ``ttl_sweep``) entries of the
        backend, from where the previous sweep stopped (wrapping at the end): a tombstone each,
        logged at the next flush. Returns how many it deleted.

        Nothing is examined while the store time is before the *horizon*, a lower bound of every
        stored expiry learnt by the last complete pass: the smallest expiry it saw, or, for what
        was written since the pass began, the pass's start time plus ttl. So a store whose entries
        are all younger than ttl costs its commits nothing."""
        now = self._now
        if now is None or now < self._horizon:
            return 0
        limit = self._sweep_limit if limit is None else limit
        self._settle()
        if self._sweep_from is None:  # a new pass
            self._pass_start, self._pass_min = now, NEVER
            if self._backend.approximate_count() == 0:  # nothing stored: the pass ends at once
                self._horizon = now + self._ttl        # (and a memory backend builds no key index)
                return 0
        iterator = self._backend.iterate(self._sweep_from, None, False)
        try:
            entries = list(islice(iterator, limit))
        finally:
            iterator.close()
        self.examined += len(entries)
        expiries = [_UNPACK(vb)[0] for _, vb in entries]
        expired = [kb for (kb, _), expiry in zip(entries, expiries) if now >= expiry]
        live = [expiry for expiry in expiries if now < expiry]
        if live:
            self._pass_min = min(self._pass_min, min(live))
        if len(entries) < limit:  # the pass is complete: every stored expiry is known to be later
            self._sweep_from = None
            self._horizon = min(self._pass_min, self._pass_start + self._ttl)
        else:
            self._sweep_from = entries[-1][0] + b"\x00"
        deleted = 0
        dirty, cache = self._dirty, self._cache
        for ckey in (self._cache_keys(expired) if self._key_class is not _NoClass else expired):
            if ckey in dirty:
                continue  # a pending write or delete supersedes the stored entry
            dirty[ckey] = None
            cache.insert(ckey, None)
            deleted += 1
        if deleted:
            self._tombstones = True
        self.swept += deleted
        return deleted
