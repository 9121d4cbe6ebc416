"""State TTL for the key-value engine (option ``ttl``): entries that expire, are never read again,
and are purged with changelog tombstones by a bounded sweep.

Stored format. A store with ``ttl`` keeps, in its changelog records and its backend, each value as
its ``expiry`` (seconds since the epoch in the store's time domain) followed by the serialized value.
The expiry is packed in one of three self-describing forms (:func:`pack_expiry`): *compact*, 4 bytes, for
a whole second from 2020 to 2088 or "never"; *long*, an 8-byte big-endian IEEE double, for an expiry
from 1e-6 to 1e12 seconds (the only form of stores written before the compact one); and *wide*, 12
bytes (the compact word with offset 0, which the compact form never uses, then the double), for every
other expiry: before 1970, zero, or past year 33658 (an event time fed in milliseconds). So every
expiry a store computes, whatever time it is fed, reads back exactly. A ttl of
:data:`WHOLE_SECONDS_TTL` or more rounds each expiry up to the whole second, so such a store's
expiries in its range are all compact: an entry may then stay visible up to one second past its ttl,
never less than its ttl. The expiry travels with the record, so
a restore from the changelog, a compacted changelog or an object-store snapshot brings back each
entry's own deadline: nothing expired becomes visible again. A store *without* ``ttl`` is the plain
:class:`~localstate.engines.kv.engine.KeyValueEngine`, unchanged.

Time. The store reads its time source (:attr:`StoreContext.time`, processing time or, with
``ttl_time = "event"``, the watermark) at open, at a restore, at every flush and when the runtime
starts a batch (``refresh_time``, the ``core.engine.TimedStore`` capability), i.e. once per commit, as Spark's transformWithState judges TTL by its micro-batch's timestamp: between two commits
the store's time stands still. An entry written in a commit interval expires ``ttl`` after the time
read at the interval's start; it is visible while that store time is before its expiry. (Reading a
clock per access would cost more than the whole cached get.) In event time, before the first
watermark nothing expires, and what is written then counts from the first watermark the store reads.

Visibility. Every read path shows live entries only: ``get``, ``get_all`` and ``get_many``,
``merge_many``'s reads, ``range``/``prefix``/``all`` and their iterators check each value they read
from local state against the store time, and the object cache holds live values only (see Cache).

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

Cache. Cached values stay plain objects, as without ttl, and the object cache holds only values live at
the store time, so a cache hit and the put of a cached key are the plain engine's (its C fast paths).
Every value a put caches expires at the write expiry; every value cached expires at the cache's
*floor* or later, but for the early ones read from local state, whose expiry the cache records
(:class:`ExpiringCache`, bounded with the cache). Each time refresh forgets the recorded entries whose
expiry has come, and when the store time reaches the floor it forgets the whole cache and sets the
floor half a ttl ahead (see :meth:`TtlKeyValueEngine._forget_expired`). The pending map holds values as
without ttl: every pending value of a commit interval shares the interval's expiry, stamped on all of
them at the flush.
"""

from __future__ import annotations

import math
import struct
import time
from collections import deque
from heapq import heapify, heappop, heappush
from itertools import islice, repeat
from typing import Any, Callable, Iterable, Iterator, Mapping

from localstate.core.backend import SortedRun
from localstate.core.codecs import FAST_ERRORS, INT_BIAS, INT_PACK
from localstate.core.engine import StoreContext
from localstate.core.time import EVENT_TIME, SystemTime, TimeSource
from localstate.engines.kv import engine as kv_engine
from localstate.engines.kv.cache import GenerationalCache
from localstate.engines.kv.engine import _MISS, KeyValueEngine, KVIterator, _NoClass
from localstate.errors import ConfigError

__all__ = ["TtlKeyValueEngine", "ExpiringCache", "EXPIRY", "NEVER", "WHOLE_SECONDS_TTL", "live_entries",
           "clock_of", "split_stored", "pack_expiry", "unpack_expiry"]

#: The long expiry prefix: a big-endian double, seconds, from _EARLIEST_EXPIRY to _LONG_LAST (its first
#: bit is 0). Other expiries take the wide form.
EXPIRY = struct.Struct(">d")
_LONG_UNPACK = EXPIRY.unpack_from
#: The compact expiry prefix: a big-endian 32-bit word whose first bit is 1, then whole seconds after
#: COMPACT_BASE in 31 bits; all ones is "never"; offset 0 starts the wide form. (A plain int value
#: below 2**32 reads as offset 0 too: its length tells it apart, see _stamped.)
_COMPACT = struct.Struct(">I")
_COMPACT_UNPACK = _COMPACT.unpack_from
COMPACT_BASE = 1_577_836_800.0  # 2020-01-01T00:00:00Z
_COMPACT_TAG, _COMPACT_NEVER, _COMPACT_OFFSET = 0x8000_0000, 0xFFFF_FFFF, 0x7FFF_FFFF
_COMPACT_NEVER_BYTES = _COMPACT.pack(_COMPACT_NEVER)
_COMPACT_LAST = COMPACT_BASE + _COMPACT_OFFSET - 1  # the last second it holds (2088); all ones is never
#: The wide expiry prefix: the compact tag with offset 0 (never a compact expiry), then the double.
_WIDE = struct.Struct(">Id")
_WIDE_UNPACK = _WIDE.unpack_from
#: A stored value of the int serde (held as ints, see KeyValueEngine): expiry and biased value in one
#: struct, so a miss unpacks it in one call (compact and long form).
_COMPACT_INT = struct.Struct(">IQ")
_LONG_INT = struct.Struct(">dQ")
#: The expiry of what is written in event time before the first watermark (until restamped).
NEVER = math.inf
#: A ttl (seconds) from which expiries are rounded up to the whole second, hence stored compact: the
#: stored value is 4 bytes shorter, and the entry lives at most a second (under 0.03% of its ttl)
#: longer. Shorter ttls keep exact expiries (an entry ends on the dot, as in Flink and Spark).
WHOLE_SECONDS_TTL = 3600.0
#: The long form's range: what a value written without ttl rarely reads as (its bytes read as a huge,
#: tiny, negative or NaN double), so a store whose layout no checkpoint recorded can tell such state.
_EARLIEST_EXPIRY = 1e-6
_LONG_LAST = 1e12


def pack_expiry(expiry: float) -> bytes:
    """``expiry`` packed as a ttl store stores it: compact (4 bytes) for never or a whole second in its
    range, long (8 bytes) from 1e-6 to 1e12 seconds, wide (12 bytes) for any other. Every expiry reads
    back exactly (:func:`unpack_expiry`); NaN, which no comparison finds due, is stored as never."""
    if expiry == NEVER or expiry != expiry:
        return _COMPACT_NEVER_BYTES
    if COMPACT_BASE < expiry <= _COMPACT_LAST and expiry.is_integer():
        return _COMPACT.pack(_COMPACT_TAG | int(expiry - COMPACT_BASE))
    if _EARLIEST_EXPIRY <= expiry <= _LONG_LAST:
        return EXPIRY.pack(expiry)
    return _WIDE.pack(_COMPACT_TAG, expiry)


def unpack_expiry(stored: bytes) -> tuple[float, int]:
    """``(expiry, width of its prefix)`` of a ttl store's stored value."""
    if stored[0] & 0x80:
        word = _COMPACT_UNPACK(stored)[0]
        if word == _COMPACT_TAG:
            return _WIDE_UNPACK(stored)[1], 12
        return (NEVER if word == _COMPACT_NEVER else COMPACT_BASE + (word & _COMPACT_OFFSET)), 4
    return _LONG_UNPACK(stored)[0], 8


def _stamped(stored: bytes, known: bool = False) -> bool:
    """Whether ``stored`` starts with an expiry: never, a compact second after the base, a wide double
    (not NaN), or a long one in its range (a value written without ttl reads as a huge, tiny, negative
    or NaN double, and an int serde's value below 2**32 as the compact offset 0 without the wide
    form's length). ``known``: the committed checkpoint recorded the store's layout as stamped, so a
    long expiry is taken whatever it reads as (releases before the wide form wrote expiries past 1e12,
    an event time in milliseconds, in the long form)."""
    if not stored:
        return False
    if stored[0] & 0x80:
        if len(stored) < 4:
            return False
        word = _COMPACT_UNPACK(stored)[0]
        if word == _COMPACT_TAG:
            return len(stored) >= 12 and not math.isnan(_WIDE_UNPACK(stored)[1])
        return True
    if len(stored) < 8:
        return False
    expiry = _LONG_UNPACK(stored)[0]
    return known or expiry == NEVER or _EARLIEST_EXPIRY <= expiry <= _LONG_LAST


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
    expiry, width = unpack_expiry(data)
    return data[width:], expiry


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
            expiry, width = unpack_expiry(vb)
            if now is None or now < expiry:
                yield kb, vb[width:]
    return live


class ExpiringCache(GenerationalCache):
    """The object cache of a ttl store: :class:`GenerationalCache` plus the expiries of the *early*
    entries (``expiry``: cached values read from local state whose expiry comes before the store's
    floor, see :class:`TtlKeyValueEngine`), with a heap of them in expiry order so that the store
    finds those whose expiry has come without scanning the cache. A record is forgotten with its
    entry (rotation, discard, clear); the heap keeps at most about twice as many items as records."""

    __slots__ = ("expiry", "_heap")

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.expiry: dict[Any, float] = {}
        self._heap: list[tuple[float, Any]] = []

    def record(self, key: Any, expiry: float) -> None:
        """Keep ``expiry`` for the cached entry ``key`` (call after inserting it)."""
        self.expiry[key] = expiry
        heap = self._heap
        heappush(heap, (expiry, key))
        if len(heap) > 2 * len(self.expiry) + 1024:  # items of forgotten records: rebuilt from the records
            heap[:] = [(when, ckey) for ckey, when in self.expiry.items()]
            heapify(heap)

    def forget_expired(self, now: float) -> None:
        """Forget every recorded entry whose expiry is ``now`` or earlier (a later read finds it again
        in local state, expired)."""
        heap, expiry = self._heap, self.expiry
        while heap and heap[0][0] <= now:
            when, key = heappop(heap)
            if expiry.get(key) == when:  # else a forgotten or superseded record's item
                self.discard(key)

    def rotate(self) -> None:
        expiry = self.expiry
        if expiry:
            # what the rotation drops (the old generation, else the young one's first-inserted half): their
            # records forgotten first, in one C-level pass without a copy of the keys
            old = self.old
            dropped = old if old else islice(self.young, len(self.young) // 2)
            deque(map(expiry.pop, dropped, repeat(None)), maxlen=0)
        super().rotate()

    def discard(self, key: Any) -> None:
        super().discard(key)
        self.expiry.pop(key, None)

    def clear(self) -> None:
        super().clear()
        self.expiry.clear()
        self._heap.clear()


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
            expiry, width = unpack_expiry(vb)
            if now is None or now < expiry:
                return kb, vb[width:]
        raise StopIteration

    def close(self) -> None:
        self._inner.close()


class TtlKeyValueEngine(KeyValueEngine):
    """A :class:`KeyValueEngine` whose entries expire ``ttl`` seconds after they were last written (see
    the module docstring): same API and guarantees, plus an expired entry reads as absent.

    The object cache holds only values live at the store time, so a cache hit (and the put of a cached
    key) is exactly the plain engine's, C fast paths included. What keeps it so, at each time refresh:
    every cached value expires at the *floor* or later, but for the *early* ones whose expiry the cache
    records (:class:`ExpiringCache`); the refresh forgets the early entries whose expiry has come, and
    when the store time reaches the floor it forgets the whole cache and sets the floor half a ttl
    ahead. A put's value expires at the write expiry (at least the floor: no record); a value read
    from local state is recorded only when it expires before the floor."""

    state_format = "kv+ttl"
    """every stored and logged value starts with its packed expiry (:func:`pack_expiry`)"""

    _cache_class = ExpiringCache
    _cache: ExpiringCache

    def __init__(self, context: StoreContext) -> None:
        options = context.options
        self._ttl = float(options["ttl"])
        self._whole_seconds = self._ttl >= WHOLE_SECONDS_TTL
        self._refresh_on_read = options.get("ttl_update", "on_write") == "on_read_and_write"
        self._sweep_limit = int(options.get("ttl_sweep", 1_000))
        self._clock = clock_of(context.time, options.get("ttl_time", "processing"))
        # the committed checkpoint recorded this layout (StoreContext.extra["state_format"], given by the
        # runtime): every stored value is stamped, whatever its expiry reads as (see _stamped)
        self._layout_known = context.extra.get("state_format") == self.state_format
        self._sweep_from: bytes | None = None
        # the sweep's horizon (see sweep): -inf, unknown, until a pass over the whole store completes
        self._horizon = -math.inf
        self._pass_start, self._pass_min = -math.inf, NEVER
        self._now: float | None = None
        self._write_expiry = NEVER
        # the cache's floor: every cached value not recorded in the cache's expiries expires at it or later
        self._floor = NEVER
        self.cache_resets = 0
        """Times the store time reached the floor and the whole object cache was forgotten (statistics)."""
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
        first watermark) counts from the first time read. Then the cache forgets what has expired
        (see the class docstring)."""
        now = self._clock()
        was_timeless = self._now is None
        write_expiry = NEVER if now is None else self._expiry_after(now)
        if self._dirty and not was_timeless and write_expiry != self._write_expiry:
            self._spill()
        self._now = None if now is None else float(now)
        self._write_expiry = write_expiry
        # a put's value expires at the write expiry: a clock set back lowers the floor with it
        self._floor = min(self._floor, write_expiry)
        if self._now is not None:
            self._forget_expired(self._now)

    def _expiry_after(self, now: float) -> float:
        """The expiry of what is written at store time ``now``: ttl later, up to the whole second for a
        long ttl (a compact stored expiry), and always after ``now``. Any expiry is stored exactly
        (:func:`pack_expiry`)."""
        expiry = now + self._ttl
        if self._whole_seconds and abs(expiry) < 1e15:  # (NaN and huge times as they are)
            expiry = float(math.ceil(expiry))
        if expiry <= now:  # a time so large that ttl is below its float resolution: live until time moves
            expiry = math.nextafter(now, math.inf)
        return expiry

    def _forget_expired(self, now: float) -> None:
        """Make every cached value live at ``now`` again: forget the recorded entries whose expiry has
        come; once ``now`` reaches the floor, below which unrecorded values may expire, forget the whole
        cache and set the floor half a ttl ahead (every value cached from then on expires later, or is
        recorded). So the cache is forgotten once per half ttl, and a value read from local state that
        was written in the last half ttl needs no record."""
        cache = self._cache
        if now >= self._floor:
            cache.clear()
            self._floor = now + self._ttl / 2
            self.cache_resets += 1
        elif cache.expiry:
            cache.forget_expired(now)

    @property
    def store_time(self) -> float | None:
        """The store's current time (read at the last open, restore or flush; None: none yet)."""
        return self._now

    # -- the C fast paths ------------------------------------------------------------------------------
    def _bind_hot_path(self) -> None:
        """The plain engine's C get/put/merge (the cache holds only live values: a hit needs no expiry
        check); a store whose reads refresh the ttl keeps the reference get/put, its get writing
        (:meth:`_get_refreshing`)."""
        if self._refresh_on_read:
            self.get = self._get_refreshing  # type: ignore[method-assign]
            return
        super()._bind_hot_path()

    # -- reads -------------------------------------------------------------------------------------
    def _get_refreshing(self, key: Any) -> Any:
        """``get`` with ``ttl_update = "on_read_and_write"``: a live value found is put again (its ttl
        restarts, and it is logged at the next flush)."""
        value = KeyValueEngine.get(self, key)
        if value is not None:
            self.put(key, value)
        return value

    def _get_missed(self, ckey: Any) -> Any:
        """As :meth:`KeyValueEngine._get_missed`, reading stamped values; an expired stored value reads
        (and is cached) as None, a live one expiring before the floor is recorded with its expiry."""
        cache = self._cache
        value = cache.old.pop(ckey, _MISS)
        if value is not _MISS:
            cache.young[ckey] = value
            return value
        held = self._dirty.get(ckey, _MISS)
        if held is not _MISS:  # written in this commit interval: expiring at the write expiry
            if held is not None and self._decode_held is not None:
                held = self._decode_pending(ckey, held)
            cache.insert(ckey, held)
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
        if self._int_values and len(vb) == 12 and vb[0] & 0x80:
            word, value = _COMPACT_INT.unpack(vb)
            expiry = NEVER if word == _COMPACT_NEVER else COMPACT_BASE + (word & _COMPACT_OFFSET)
            value -= INT_BIAS
        elif self._int_values and len(vb) == 16 and not vb[0] & 0x80:
            expiry, value = _LONG_INT.unpack(vb)
            value -= INT_BIAS
        else:
            expiry, width = unpack_expiry(vb)
            value = _MISS
        now = self._now
        if now is not None and now >= expiry:
            cache.insert(ckey, None)
            return None
        if value is _MISS:
            vb = vb[width:]
            try:
                value = self._vde_fast(vb)
            except FAST_ERRORS:
                value = self._decode_value(kb, vb)
        if cache.size:  # insert puts it in the young generation
            cache.insert(ckey, value)
            if expiry < self._floor:
                cache.record(ckey, expiry)
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

    def _get_missed_many(self, ckeys: list[Any]) -> dict[Any, Any]:
        # the misses of a batched read, one at a time (the reference: a batched read of a ttl store
        # needs each stored value's expiry)
        return {ckey: self._get_missed(ckey) for ckey in ckeys}

    # -- writes --------------------------------------------------------------------------------------
    def _stamp(self) -> bytes:
        """Every pending value was written in this commit interval: stamped with its expiry."""
        return pack_expiry(self._write_expiry)

    def _py_pending_items(self) -> tuple[list[Any], list[tuple[bytes, bytes | None]]]:
        """The reference of the C flush for a ttl store: :meth:`KeyValueEngine._py_pending_items`, each
        value stamped with the commit interval's expiry (:meth:`_stamp`)."""
        prefix = self._stamp()
        if self._int_values and not self._tombstones:  # ints held as objects: pack and stamp at once
            dirty = self._dirty
            ckeys = sorted(dirty)
            values = map(INT_PACK, map(INT_BIAS.__add__, map(dirty.__getitem__, ckeys)))
            return ckeys, list(zip(self._encode_keys(ckeys), map(prefix.__add__, values)))
        ckeys, kbs, vbs = self._pending_columns()
        stamp = prefix.__add__
        if self._tombstones:
            stamped = [None if vb is None else stamp(vb) for vb in vbs]
        else:
            stamped = list(map(stamp, vbs))
        return ckeys, list(zip(kbs, stamped))

    # -- iteration ---------------------------------------------------------------------------------------
    def _iterate(self, start: bytes | None, end: bytes | None, reverse: bool) -> KVIterator:
        """Live entries only, at the store time (pending values are all live: written at it)."""
        if len(self._dirty) > kv_engine.SCAN_SPILL:
            self._spill()
        self._settle()
        now = self._now
        if (start is not None and end is not None and start >= end) or not self._dirty:
            pending: list[tuple[bytes, bytes | None]] = []
        else:
            width = len(pack_expiry(self._write_expiry))  # every pending value's prefix
            pending = [(k, None if v is None else v[width:]) for k, v in self._pending_items(with_keys=False)[1]
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
        """As the base class, with every record already expired turned into a tombstone of its key.

        A restored value is the key's committed value at its changelog offset; if it has expired,
        the committed state holds no entry for the key, so local state must hold none either. A
        tombstone (not a skip) is what makes a rollback exact: recovery's trim re-writes each key's
        checkpointed value over uncommitted local writes, and an expired committed value must delete
        the newer, uncommitted one, never leave it in place."""
        chunk = super()._prepare_restored(chunk)
        if not chunk:
            return chunk
        values = chunk.values()
        self._check_stamped(values)
        now = self._now
        if now is None or all(v is None or now < unpack_expiry(v)[0] for v in values):
            return chunk
        live = {k: (v if v is None or now < unpack_expiry(v)[0] else None) for k, v in chunk.items()}
        if isinstance(chunk, SortedRun):
            return SortedRun(list(live), list(live.values()), chunk.key_sizes,
                             sum(map(len, live)) + sum(len(v) for v in live.values() if v is not None),
                             sum(1 for v in live.values() if v is None))
        return live

    def _check_stamped(self, values: Iterable[bytes | None]) -> None:
        """ConfigError when a stored value carries no plausible expiry: the store's state was written
        without ttl (adding or removing ttl changes the stored format)."""
        # an int serde's stamped value is its prefix and 8 bytes: its plain one (8) is refused whatever
        # it reads as
        int_values, known = self._int_values, self._layout_known
        for vb in values:
            if vb is not None and (not _stamped(vb, known) or (int_values and len(vb) != unpack_expiry(vb)[1] + 8)):
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
        expiries = [unpack_expiry(vb)[0] for _, vb in entries]
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
