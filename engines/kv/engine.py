"""The key-value engine: Samza's CachedStore + SerializedStore + LoggedStore over a pluggable
ordered backend.

Layers, top to bottom: object cache (``cache.GenerationalCache``: bounded, read-your-writes) and
pending changes (the coalesced map of keys changed since the last spill/flush, holding each value's
bytes, encoded once at its put; the int serde's values as objects, packed at the flush) -> the
logged-store layer
(``localstate.core.logged``: changelog first, then one atomic backend write with the offset) -> a
backend plugin (``localstate.core.backend``).

Cache keys: for the built-in ``string``/``int``/``bytes`` key serdes, the key object itself when it
is of exactly the serde's class (``str``/``int``/``bytes``: equal such keys always encode equally,
and their order is their encodings' order), else the object of that class the key encodes to; for
any other serde the serialized key. So ``1``, ``1.0`` and ``True`` never alias: under the int serde
only ``1`` is a key, under json they are three keys.

Guarantees (see ``localstate.core.engine``):

* ``put`` raises the typed error for a key or value the serdes refuse, or a key of a size the
  backend cannot hold, before anything is logged. A value is encoded once, at its put (the check
  is the encoding): what is logged is the value as it was put.
* ``flush()`` appends one record per key changed since the previous flush (the bytes of its last
  put), flushes the changelog (end offset ``n``), then writes the changes *and* ``n`` in one
  atomic backend write.
* A spill (``write_batch_size`` pending keys before a commit) first appends and flushes the
  changelog, then writes the backend *without* touching the recorded offset, so local state never
  runs ahead of the changelog and ``local_offset()`` stays at the last commit.
* Iterators are snapshots of the merged view (pending writes + backend) at the moment they open.

Performance: ``get``/``put`` run in C where the extension ``localstate.native._hotpath`` is built
(see ``_bind_hot_path``), else they are the methods below (the reference): a cache hit is one
dict lookup, a put of a cached key two dict stores (and a class/range check of an int value, or
the value's one encoding); no key is encoded until the flush, which sorts the changed keys once and
encodes them (and int values) with one C-level ``map`` per column (``core/codecs.py``), then hands the changelog and the backend one
key-sorted list (cheap RocksDB memtable inserts, LMDB bulk put).

Write-behind (option ``write_behind``): the flush's backend write runs on the logged store's
background thread once the changelog is flushed; until it lands, ``get`` serves its keys from
``_inflight`` (between the pending map and the backend), and everything else that reads or writes
the backend settles first (``_settle``).
"""

from __future__ import annotations

import weakref
from itertools import repeat
from operator import itemgetter
from typing import Any, Iterable, Iterator, Mapping

from localstate.core.changelog import ChangelogRecord, RecordColumns
from localstate.core.engine import StorageEngine, StoreContext
from localstate.core.serdes import BytesSerde, IntSerde, JsonSerde, PickleSerde, Serde, StringSerde, ensure_bytes
from localstate.core.backend import BackendIterator, KVBackend, key_sizes, prefix_end, sorted_items
from localstate.core.registry import open_store_backend
from localstate.core.codecs import (FAST_ERRORS, INT_MAX, INT_MIN, fast_codec, inline_int_class, many_encoder,
                                    native_class)
from localstate.core.logged import META_OFFSET, LoggedStore
from localstate.engines.kv.cache import GenerationalCache
from localstate.core.text import a
from localstate.engines.kv.options import KV_OPTIONS
from localstate.errors import InvalidValueError, RestoreError, SerdeError, StoreClosedError
from localstate.native import load as load_native

__all__ = ["KeyValueEngine", "KVIterator", "META_OFFSET"]


_MISS = object()
#: The C get/put fast paths (native/_hotpath.c), or None: the reference methods get/put run.
_HOTPATH = load_native("localstate.native._hotpath")
#: The C flush (native/_sorting.c ``pending_items``), or None: :meth:`KeyValueEngine._py_pending_items` runs.
_SORTING = load_native("localstate.native._sorting")
#: ``pending_items``'s key kinds: cache keys that are their own encoding (bytes), str (UTF-8), int (8 bytes).
_KEY_KINDS = {str: 1, int: 2}


class _NoClass:
    """A class no value has (disables a class-keyed fast path)."""

# Public methods replaced by a StoreClosedError raiser on close(), so the hot path needs no check.
_API = ("get", "get_all", "put", "put_all", "delete", "delete_all", "range", "prefix", "all",
        "approximate_count", "restore", "flush", "local_offset", "get_many", "put_many", "merge_many")

#: ``merge_many`` operations: ``new = op(current, delta)`` (``delta`` alone for an absent key).
MERGE_OPS = ("add", "min", "max")

SCAN_SPILL = 256
"""Pending changes from which a range scan (``range``, ``prefix``, ``all``) spills them to the backend
first: a scan merges the pending changes it covers, which costs encoding and sorting all of them, so
many scans between two commits (closing thousands of windows in one batch, each a prefix scan
followed by deletes) would cost the pending count each, quadratic in it. A spill is what
``write_batch_size`` does anyway: changelog records first, the local offset unchanged."""


_TRUSTED_SERDES = (BytesSerde, StringSerde, IntSerde, JsonSerde, PickleSerde)


def _checked_serialize(serde: Serde[Any], serialize: Any) -> Any:
    """``serialize`` itself for the built-in serdes (they always return bytes); for any other serde a
    wrapper that raises SerdeError when it returns something else (None, str): caught at put, before
    anything reaches the changelog."""
    if type(serde) in _TRUSTED_SERDES:
        return serialize

    def checked(obj: Any) -> bytes:
        return ensure_bytes(serialize(obj), serde)

    return checked


class KeyValueEngine(StorageEngine):
    """A key-value store partition: ``get/put/delete``, batch variants, ordered range scans."""

    state_format = "kv"
    """how its state is laid out (:class:`~localstate.core.engine.StateFormat`)"""

    #: the object cache's class (a store with ttl records the expiries of the cached values that expire early)
    _cache_class: type[GenerationalCache] = GenerationalCache

    def __init__(self, context: StoreContext, backend: KVBackend | None = None) -> None:
        super().__init__(context)
        opts = {name: opt.default for name, opt in KV_OPTIONS.items()}
        opts.update(context.options)
        self._store = context.store
        self._partition = context.partition
        self._backend: KVBackend = backend if backend is not None else open_store_backend(context, opts)
        kserde, vserde = context.key_serde, context.value_serde
        self._kser = _checked_serialize(kserde, kserde.serialize)
        self._kde = kserde.deserialize
        self._vser = _checked_serialize(vserde, vserde.serialize)
        self._vde = vserde.deserialize
        # builtin-speed codecs for the built-in serdes (see codecs.py); errors go back through the serde
        kfast, self._kde_fast = fast_codec(kserde)
        vfast, self._vde_fast = fast_codec(vserde)
        self._kfast = _checked_serialize(kserde, kfast)
        self._vfast = _checked_serialize(vserde, vfast)
        # Cache keys: objects of the key serde's native class stand for their bytes (see _canonical)
        self._key_class: type = native_class(kserde) or _NoClass
        self._encode_keys = many_encoder(kserde) if self._key_class is not _NoClass else list
        self._encode_values = many_encoder(vserde)
        self._int_values = inline_int_class(vserde) is int  # exact ints: checked by class and range
        # The bytes serde's exact bytes are their own encoding: a put or delete of such keys (values)
        # needs no serde call, only the backend's size check (e.g. the timer store's entries).
        self._raw_keys = type(kserde) is BytesSerde
        self._raw_values = type(vserde) is BytesSerde
        # How the flush encodes cache keys in C (_pending_items): str and int keys by their serde's
        # encoding, every other cache key is already its bytes (the bytes serde's, or serialized keys).
        self._key_kind = _KEY_KINDS.get(self._key_class, 0)
        self._native_flush = None if _SORTING is None else _SORTING.pending_items
        # Values are encoded once, at put, and the pending map holds those bytes (a bytearray put is
        # copied, as the bytes serde does); only the int serde's values are held as objects (an exact
        # int is checked by class and range, and packed at the flush, cheaper than packing it twice).
        self._hold_encoded = not self._int_values
        # a pending value's object again, for a read that misses the cache but finds the key pending
        # (None: the held bytes are the object, as with the bytes serde)
        self._decode_held = None if type(vserde) is BytesSerde or self._int_values else self._vde_fast
        self._cache = self._cache_class(int(opts["cache_size"]))
        self._batch = int(opts["write_batch_size"])
        self._restore_batch = int(opts["restore_batch_size"])
        # cache key -> value object (None: a delete) changed since the last spill/flush; encoded at flush
        self._dirty: dict[Any, Any] = {}
        self._tombstones = False   # whether _dirty may hold a None (a delete): backends bulk-put otherwise
        self._iterators: "weakref.WeakSet[KVIterator]" = weakref.WeakSet()
        self._max_key = getattr(self._backend, "max_key_size", 1 << 62)
        self._min_key = getattr(self._backend, "min_key_size", 0)
        self.spills = 0
        """Number of spills since open (statistics)."""
        # write-behind: cache key -> serialized value of the commit whose backend write may still be
        # running, readable until the next settle (see _settle); empty without write-behind
        self._inflight: dict[Any, bytes | None] = {}
        self._logged = LoggedStore(context, self._backend, write_behind=bool(opts["write_behind"]))
        self._backend_failed = self._logged.failed
        self._closed = False
        self._hot_merge: Any = None
        # the batched operations' per-row passes in C (HotPath.lookup, put_many, missing), or None
        self._hot_lookup: Any = None
        self._hot_put_many: Any = None
        self._hot_missing: Any = None
        self._merge_op = "add"
        #: whether batched misses take the column-wise path (:meth:`_read_cold`); False: the reference
        self._bulk_misses = True
        self._bind_hot_path()

    # -- keys ------------------------------------------------------------------------------------
    def _canonical(self, key: Any) -> Any:
        """The cache key of ``key``: for the built-in string/int/bytes key serdes an object of exactly
        the serde's class (equal such objects always encode equally, and no other object is used:
        ``True`` or ``1.0`` never alias ``1``); for any other serde the serialized key. Raises the
        typed SerdeError for a key the serde refuses."""
        if key.__class__ is self._key_class:
            return key
        kb = self._ser_key(key)
        if self._key_class is _NoClass:
            return kb
        return self._kde_fast(kb)  # e.g. a str subclass -> its str, a bytearray -> bytes

    def _key_bytes(self, ckey: Any) -> bytes:
        """The serialized key of cache key ``ckey`` (typed SerdeError when it cannot be encoded)."""
        if self._key_class is _NoClass:
            return ckey
        try:
            return self._kfast(ckey)
        except FAST_ERRORS:
            return self._slow_key(ckey)

    def _checked_key(self, key: Any) -> tuple[Any, bytes]:
        """``(cache key, serialized key)`` of a key to write: typed errors for a key the serde refuses
        or of a size the backend cannot hold, raised before anything is logged."""
        ckey = self._canonical(key)
        kb = self._key_bytes(ckey)
        if not self._min_key <= len(kb) <= self._max_key:
            # a logged but unwritable record would break every restore
            raise self._bad_key_size(key, kb)
        return ckey, kb

    def _held_value(self, key: Any, value: Any) -> Any:
        """``value`` as the pending map holds it, encoded once (typed SerdeError at put, not at flush):
        its bytes, or for the int serde the object itself (packed at the flush)."""
        if value is None:
            raise self._none_value(key)
        try:
            vb = self._vfast(value)
        except FAST_ERRORS:
            vb = self._slow_value(key, value)
        return vb if self._hold_encoded else value

    def _decode_pending(self, ckey: Any, vb: bytes) -> Any:
        """The object of a pending value held encoded (read after the cache lost it)."""
        try:
            return self._decode_held(vb)  # type: ignore[misc]
        except FAST_ERRORS:
            return self._decode_value(self._key_bytes(ckey), vb)

    def _bind_hot_path(self) -> None:
        """Install the C ``get``/``put`` (``localstate.native._hotpath``) on this instance, when built.

        Behaviour is exactly that of the class's :meth:`get`/:meth:`put` (the reference versions,
        which stay installed without the extension or with ``LOCALSTATE_PURE_PYTHON``). For keys of
        exactly the key serde's native class (see :meth:`_canonical`) a cache hit is one dict lookup
        and no key encoding; a put of a cached key (the read-modify-write pattern) stores the object in
        two dicts, encoding nothing (the flush encodes each changed key once); for int values it checks
        class and range instead of packing. Every other case calls the reference code: :meth:`_get_missed`
        for a miss in both cache generations, :meth:`get`/:meth:`put` for anything else
        (``tests/native/test_differential.py`` runs the C and the reference side by side).
        """
        if _HOTPATH is None:
            return
        cache = self._cache
        hot = _HOTPATH.HotPath(young=cache.young, old=cache.old, dirty=self._dirty, key_class=self._key_class,
                               batch=self._batch, spill=self._spill,
                               reference_get=KeyValueEngine.get.__get__(self), missed=self._get_missed,
                               put_slow=KeyValueEngine.put.__get__(self),
                               int_values=self._int_values, int_min=INT_MIN, int_max=INT_MAX,
                               vfast=self._vfast, slow_value=self._slow_value, errors=FAST_ERRORS,
                               hold_encoded=self._hold_encoded, merge_slow=self._merge_slow)
        self.get, self.put = hot.get, hot.put  # type: ignore[method-assign]
        if (self._key_class is not _NoClass and type(cache) is GenerationalCache
                and type(self)._get_missed is KeyValueEngine._get_missed):
            # get's misses read in C too (not a subclass's own _get_missed: the ttl store's)
            hot.cold_reads(backend=self._backend, inflight=self._inflight, key_kind=self._key_kind,
                           min_key=self._min_key, max_key=self._max_key, cache_size=cache.size, rotate=cache.rotate,
                           vdecode=self._vde_fast)
        if self._key_class is not _NoClass:  # the batched operations' passes over keys of that class
            self._hot_lookup, self._hot_put_many, self._hot_missing = hot.lookup, hot.put_many, hot.missing
        if self._int_values and self._key_class is not _NoClass:
            self._hot_merge = hot.merge  # merge_many's per-row loop in C (int values need no encoding)

    def _slow_key(self, key: Any) -> bytes:
        """Encode ``key`` through the serde after the fast path refused it (raises the SerdeError)."""
        try:
            return self._kser(key)
        except SerdeError as exc:
            raise self._key_error(exc, key) from None

    def _slow_value(self, key: Any, value: Any) -> bytes:
        """Encode ``value`` through the serde after the fast path refused it (raises the SerdeError)."""
        try:
            return self._vser(value)
        except SerdeError as exc:
            raise self._value_error(exc, key) from None

    # -- errors ----------------------------------------------------------------------------------
    def _ctx(self) -> dict[str, Any]:
        return {"store": self._store, "partition": self._partition}

    def _key_error(self, exc: SerdeError, key: object) -> SerdeError:
        return SerdeError(f"bad key {key!r:.80} for store {self._store!r}: {exc.message}",
                          hint=exc.hint or "pass keys of the type the store's key serde expects", **self._ctx())

    def _value_error(self, exc: SerdeError, key: object) -> SerdeError:
        return SerdeError(f"bad value for key {key!r:.80} of store {self._store!r}: {exc.message}",
                          hint=exc.hint or "pass values the store's value serde accepts", **self._ctx())

    def _none_value(self, key: object) -> InvalidValueError:
        return InvalidValueError(f"None is not a valid value (key {key!r:.80}); None marks deletions",
                                 hint="call delete(key) to remove a key", **self._ctx())

    def _bad_key_size(self, key: object, kb: bytes) -> InvalidValueError:
        return InvalidValueError(
            f"key {key!r:.80} serializes to {len(kb)} bytes; the {self._backend.name} backend accepts "
            f"{self._min_key}..{self._max_key} bytes", hint="use shorter keys or the rocksdb backend", **self._ctx())

    def _decode_key(self, kb: bytes) -> Any:
        try:
            return self._kde(kb)
        except SerdeError as exc:
            raise SerdeError(f"cannot decode a key of store {self._store!r}: {exc.message}",
                             hint="check that the key serde matches the data", **self._ctx()) from exc

    def _decode_value(self, kb: bytes, vb: bytes) -> Any:
        try:
            return self._vde(vb)
        except SerdeError as exc:
            raise SerdeError(f"cannot decode the value of key {kb[:64]!r} in store {self._store!r}: "
                             f"{exc.message}", hint="check that the value serde matches the data",
                             **self._ctx()) from exc

    # -- reads -----------------------------------------------------------------------------------
    def get(self, key: Any) -> Any:
        """The value of ``key``, or None. Sees this task's own unflushed writes."""
        # a key of exactly the key class is its own cache key (see _canonical): no call for it
        ckey = key if key.__class__ is self._key_class else self._canonical(key)
        value = self._cache.young.get(ckey, _MISS)
        if value is not _MISS:
            return value
        return self._get_missed(ckey)

    def _get_missed(self, ckey: Any) -> Any:
        """:meth:`get` of cache key ``ckey`` after a miss in the young generation: the old generation
        (promoted), the pending changes, the in-flight commit (write-behind), then the backend; the
        result is cached. Only keys that encode, at a size the backend holds, enter the cache (a put
        of a cached key then needs no check)."""
        cache = self._cache
        value = cache.old.pop(ckey, _MISS)
        if value is not _MISS:
            cache.young[ckey] = value  # moved from the old generation: the count is unchanged
            return value
        value = self._dirty.get(ckey, _MISS)
        if value is not _MISS:
            if value is not None and self._decode_held is not None:
                value = self._decode_pending(ckey, value)
            cache.insert(ckey, value)
            return value
        if self._key_class is _NoClass:  # as _key_bytes, inline: this is every miss of the C hot path too
            kb = ckey
        else:
            try:
                kb = self._kfast(ckey)
            except FAST_ERRORS:
                kb = self._slow_key(ckey)
        if not self._min_key <= len(kb) <= self._max_key:
            return None  # the backend cannot hold such a key: it cannot exist
        vb = self._stored_bytes(ckey, kb)
        if vb is None:
            value = None
        else:
            try:
                value = self._vde_fast(vb)
            except FAST_ERRORS:
                value = self._decode_value(kb, vb)
        cache.insert(ckey, value)
        return value

    def _stored_bytes(self, ckey: Any, kb: bytes) -> bytes | None:
        """The stored value of ``ckey`` (serialized ``kb``): from the in-flight commit (write-behind),
        else the backend (settling first when it cannot read beside a background write)."""
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
        return vb  # type: ignore[return-value]

    def get_all(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """Values of ``keys`` as a dict; absent keys are left out."""
        result: dict[Any, Any] = {}
        misses: list[tuple[Any, Any, bytes]] = []
        cache, dirty = self._cache, self._dirty
        for key in keys:
            ckey = self._canonical(key)
            value = cache.get(ckey, _MISS)
            if value is _MISS:
                value = dirty.get(ckey, _MISS)
                if value is _MISS:
                    kb = self._key_bytes(ckey)
                    if self._min_key <= len(kb) <= self._max_key:
                        misses.append((key, ckey, kb))
                    continue
                if value is not None and self._decode_held is not None:
                    value = self._decode_pending(ckey, value)
            if value is not None:
                result[key] = value
        if misses:
            self._settle()
            try:
                found = self._backend.get_many([kb for _, _, kb in misses])
            except Exception as exc:
                raise self._backend_failed(exc) from exc
            for (key, ckey, kb), vb in zip(misses, found):
                value = None if vb is None else self._decode_value(kb, vb)
                cache.insert(ckey, value)
                if value is not None:
                    result[key] = value
        return result

    # -- writes ----------------------------------------------------------------------------------
    def put(self, key: Any, value: Any) -> None:
        """Set ``key`` to ``value`` (not None). Logged at the next flush, coalesced per key; the value is
        encoded now, once: what is logged is the value as it was put."""
        if value is None:
            raise self._none_value(key)
        young = self._cache.young
        if key.__class__ is self._key_class and key in young:
            # A key in the young generation was checked when it entered the cache (see _get_missed):
            # only the value is checked, an exact int by class and range (cheaper than packing it).
            if self._int_values and value.__class__ is int and INT_MIN <= value <= INT_MAX:
                held = value
            else:
                held = self._held_value(key, value)
            young[key] = value
            ckey = key
        elif self._raw_keys and key.__class__ is bytes and self._min_key <= len(key) <= self._max_key:
            ckey = key
            held = value if self._raw_values and value.__class__ is bytes else self._held_value(key, value)
            self._cache.insert(ckey, value)
        else:
            ckey, _ = self._checked_key(key)
            held = self._held_value(key, value)
            self._cache.insert(ckey, value)
        dirty = self._dirty
        dirty[ckey] = held
        if len(dirty) > self._batch:
            self._spill()

    def put_all(self, entries: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> None:
        """Put many entries (a mapping or ``(key, value)`` pairs)."""
        pairs = entries.items() if isinstance(entries, Mapping) else entries
        put = self.put
        for key, value in pairs:
            put(key, value)

    def delete(self, key: Any) -> None:
        """Remove ``key`` (a no-op if absent, but still logged as a tombstone)."""
        ckey = self._canonical(key)
        kb = self._key_bytes(ckey)
        if not self._min_key <= len(kb) <= self._max_key:
            return  # a key the backend cannot hold cannot exist: nothing to delete or log
        self._cache.insert(ckey, None)
        dirty = self._dirty
        dirty[ckey] = None
        self._tombstones = True
        if len(dirty) > self._batch:
            self._spill()

    def delete_all(self, keys: Iterable[Any]) -> None:
        """Remove many keys: ``delete(k)`` for each, in one step when every key is exactly ``bytes`` of
        a size the backend holds and the key serde is ``bytes`` (the keys are their own encoding)."""
        keys = keys if isinstance(keys, list) else list(keys)
        if (keys and self._raw_keys and set(map(type, keys)) <= {bytes}
                and self._min_key <= min(map(len, keys)) and max(map(len, keys)) <= self._max_key):
            cache = self._cache
            if cache.size:
                insert = cache.insert
                for key in keys:
                    insert(key, None)
            dirty = self._dirty
            dirty.update(dict.fromkeys(keys))  # None: a delete
            self._tombstones = True
            if len(dirty) > self._batch:
                self._spill()
            return
        delete = self.delete
        for key in keys:
            delete(key)

    def _spill(self) -> None:
        """Write pending changes to the backend before a commit, obeying the contract: their
        changelog records are made durable first, and the recorded local offset does not move."""
        _, items = self._pending_items(with_keys=False)
        self._settle()
        self._logged.spill(items, deletes=self._tombstones)
        self._dirty.clear()  # cleared in place: the C hot path holds this dict
        self._tombstones = False
        self.spills += 1

    def _pending_items(self, with_keys: bool = True) -> tuple[list[Any] | None, list[tuple[bytes, bytes | None]]]:
        """The pending changes, encoded now: ``(cache keys, [(key, value), ...])`` in key order (the
        cache keys only ``with_keys``, else None), each stored value after :meth:`_stamp`. In C where
        the extension is built (``_sorting.pending_items``: keys encoded, values packed and sorted by
        stored key in one pass, no Python step per record), else, or for a pending entry it does not
        take (e.g. an int subclass value), by :meth:`_py_pending_items`, the reference: the same bytes
        in the same order (``tests/native/test_differential.py``)."""
        if self._native_flush is not None and self._dirty:
            done = self._native_flush(self._dirty, self._key_kind, self._int_values, self._stamp(), with_keys)
            if done is not NotImplemented:
                return done  # type: ignore[no-any-return]
        return self._py_pending_items()

    def _stamp(self) -> bytes:
        """What goes before every stored value at this flush (nothing; a ttl store's expiry)."""
        return b""

    def _py_pending_items(self) -> tuple[list[Any], list[tuple[bytes, bytes | None]]]:
        """:meth:`_pending_items` in Python (the reference of the C flush; see :meth:`_pending_columns`)."""
        if self._encode_keys is list and self._hold_encoded:
            # Cache keys are the stored keys and values are held encoded (the timer store's bytes): the
            # pending map's items in key order are the changes, sorted in C (core.backend.sorted_items).
            items = sorted_items(self._dirty)
            items = items if type(items) is list else list(items)
            return list(map(itemgetter(0), items)), items
        ckeys, kbs, vbs = self._pending_columns()
        return ckeys, list(zip(kbs, vbs))

    def _pending_columns(self) -> tuple[list[Any], list[bytes], list[Any]]:
        """The pending changes, encoded now, as columns in key order: cache keys, keys, values (None:
        a delete).

        One pass: sort the cache keys (the order of their encodings, see ``codecs.native_class``),
        encode keys and values with one C-level map each. Key order makes the backend write several
        times cheaper (RocksDB inserts each key into its memtable skiplist starting from the previous
        insert's position; LMDB touches each B-tree page once). Values are held encoded since their
        put, but for the int serde's (packed here)."""
        dirty = self._dirty
        ckeys = sorted(dirty)
        values = list(map(dirty.__getitem__, ckeys))
        kbs = self._encode_keys(ckeys)
        if self._hold_encoded:  # encoded at put: bytes, or None for a delete
            return ckeys, kbs, values
        try:
            if self._tombstones:
                present = [v for v in values if v is not None]
                encoded = iter(self._encode_values(present))
                vbs = [None if v is None else next(encoded) for v in values]
            else:
                vbs = self._encode_values(values)
        except SerdeError as exc:
            raise SerdeError(f"cannot encode a pending value of store {self._store!r} at flush: {exc.message}",
                             hint="do not mutate a value after put() into something its serde cannot "
                                  "encode", **self._ctx()) from exc
        return ckeys, kbs, vbs

    # -- batched operations ----------------------------------------------------------------------
    def get_many(self, keys: Iterable[Any]) -> list[Any]:
        """The values of ``keys``, in order (None for an absent key): ``[get(k) for k in keys]``, with
        the cache looked up in one C-level pass (``HotPath.lookup`` when every key is of the key
        serde's class) and one backend read (``KVBackend.get_many``) for the distinct keys neither
        cached nor pending."""
        keys = keys if isinstance(keys, list) else list(keys)
        if self._hot_lookup is not None:
            found = self._hot_lookup(keys, _MISS)
            if found is not None:
                values, missed = found
                if missed is not None:
                    self._fill_missed(keys, values, missed)
                return values  # type: ignore[no-any-return]
        return self._lookup_many(self._read_keys(keys))

    def put_many(self, keys: Iterable[Any], values: Iterable[Any]) -> None:
        """``put(k, v)`` for each pair, in order, coalesced: a key given several times keeps its last
        value, and only that value is encoded (once). Every key and surviving value is checked before
        anything is applied: a SerdeError or InvalidValueError (a None value, a key the backend cannot
        hold) applies none of the batch."""
        keys = keys if isinstance(keys, list) else list(keys)
        values = values if isinstance(values, list) else list(values)
        if self._hot_put_many is not None and self._hot_put_many(keys, values) is not NotImplemented:
            return  # every key cached and every value on put's fast path: applied in C, in one pass
        self._same_length(keys, values, "values")
        latest = dict(zip(self._write_keys(keys), values))
        self._apply(latest, self._held_many(latest))

    def merge_many(self, keys: Iterable[Any], deltas: Iterable[Any], op: str = "add", *,
                   results: bool = False) -> list[Any] | None:
        """Read-modify-write of many keys in one pass: for each ``(key, delta)`` in order, the key's value
        becomes ``delta`` if it is absent, else ``current + delta`` (``op="add"``), ``min(current,
        delta)`` or ``max(current, delta)``. Exactly the per-key ``put(k, op(get(k), d))`` loop (repeated
        keys fold in order, so float sums round the same), but each distinct key is read once (one
        backend read for the misses), written and encoded once. Checked as :meth:`put_many` (nothing
        applied on an error; ``TypeError`` from the operation itself, e.g. ``str + int``, as the loop
        would raise it). ``results=True`` returns each row's new value (the running value), in order.

        With the int value serde and the C extension the per-row loop runs in C (each row a dict
        lookup, an add and two dict stores; nothing to encode): rows before a failing row are then
        applied, as in the per-key loop. Either way a failure fails the task's batch, rolled back to
        the last commit."""
        if op not in MERGE_OPS:
            raise InvalidValueError(f"merge_many: unknown op {op!r}; use one of {', '.join(MERGE_OPS)}",
                                    hint="op='add', 'min' or 'max'", **self._ctx())
        keys = keys if isinstance(keys, list) else list(keys)
        deltas = deltas if isinstance(deltas, list) else list(deltas)
        self._same_length(keys, deltas, "deltas")
        if self._hot_merge is not None:
            self._merge_op = op
            how = MERGE_OPS.index(op)
            if not results and self._cache.size:
                # rows up to the first key the cache misses (none, once the keys are cached: no
                # pass to look for misses), then the rest's misses read at once (_prefetch)
                done = self._hot_merge(keys, deltas, how, False, True)
                if done is None:
                    return None
                keys, deltas = keys[done:], deltas[done:]
            self._prefetch(keys)
            return self._hot_merge(keys, deltas, how, results)
        ckeys = self._write_keys(keys)
        distinct = list(dict.fromkeys(ckeys))
        current = dict(zip(distinct, self._lookup_many(distinct)))
        out: list[Any] | None = [] if results else None
        if op == "add":
            if out is None:
                for ckey, delta in zip(ckeys, deltas):
                    value = current[ckey]
                    current[ckey] = delta if value is None else value + delta
            else:
                append = out.append
                for ckey, delta in zip(ckeys, deltas):
                    value = current[ckey]
                    current[ckey] = value = delta if value is None else value + delta
                    append(value)
        else:
            smaller = op == "min"
            for ckey, delta in zip(ckeys, deltas):
                value = current[ckey]
                if value is None or (delta < value if smaller else delta > value):
                    value = current[ckey] = delta
                if out is not None:
                    out.append(value)
        self._apply(current, self._held_many(current))
        return out

    def _prefetch(self, keys: list[Any]) -> None:
        """Bring the distinct keys of ``keys`` that miss the young cache generation into the cache
        with one backend read (:meth:`_get_missed_many`), so that the C merge loop finds each of
        them there instead of calling back into Python for a read per key (a cold batch: a fresh
        instance, keys not seen for a while). The keys come from one C pass (``HotPath.missing``:
        nothing to do when the cache holds them all); only keys of exactly the key class (the only
        ones the C loop looks up), and only as many as the cache holds: a batch larger than the
        cache would evict its own prefetched keys."""
        if not self._cache.size:
            return
        missing = self._hot_missing(keys)  # None: keys the C loop hands to merge_slow anyway
        if missing and len(missing) + len(self._cache.young) <= self._cache.size:
            self._get_missed_many(missing)

    def _merge_slow(self, key: Any, delta: Any) -> Any:
        """One row of :meth:`merge_many` through :meth:`get`/:meth:`put` (the C loop's fallback)."""
        value = self.get(key)
        op = self._merge_op
        if value is None:
            value = delta
        elif op == "add":
            value = value + delta
        elif (delta < value) if op == "min" else (delta > value):
            value = delta
        self.put(key, value)
        return value

    def _same_length(self, keys: list[Any], values: list[Any], what: str) -> None:
        if len(keys) != len(values):
            raise InvalidValueError(f"{len(keys)} keys but {len(values)} {what}", hint=f"pass one {what[:-1]} per key",
                                    **self._ctx())

    def _read_keys(self, keys: list[Any]) -> list[Any]:
        """The cache keys of ``keys`` (the list itself when every key is of exactly the key class)."""
        kc = self._key_class
        if kc is not _NoClass and set(map(type, keys)) <= {kc}:
            return keys
        return list(map(self._canonical, keys))

    def _write_keys(self, keys: list[Any]) -> list[Any]:
        """:meth:`_read_keys` of keys to write, each distinct key checked as :meth:`put` checks it (a
        key in the young cache generation was checked when it entered the cache)."""
        kc = self._key_class
        if kc is not _NoClass and set(map(type, keys)) <= {kc}:
            young = self._cache.young
            for key in dict.fromkeys(keys).keys() - young.keys():
                self._checked_key(key)
            return keys
        checked = self._checked_key
        return [checked(key)[0] for key in keys]

    def _lookup_many(self, ckeys: list[Any]) -> list[Any]:
        """:meth:`get` of each cache key, in order (None: absent): the young generation in one C-level
        pass, then :meth:`_get_missed_many` for the distinct keys it missed."""
        values = list(map(self._cache.young.get, ckeys, repeat(_MISS)))
        missed = [i for i, value in enumerate(values) if value is _MISS]
        if missed:
            self._fill_missed(ckeys, values, missed)
        return values

    def _fill_missed(self, ckeys: list[Any], values: list[Any], missed: list[int]) -> None:
        """Fill ``values[i]`` for each position ``i`` in ``missed`` (the young generation missed
        ``ckeys[i]``) through :meth:`_get_missed_many` of the distinct keys."""
        found = self._get_missed_many(list(dict.fromkeys([ckeys[i] for i in missed])))
        for i in missed:
            values[i] = found[ckeys[i]]

    def _get_missed_many(self, ckeys: list[Any]) -> dict[Any, Any]:
        """:meth:`_get_missed` of distinct cache keys, with one backend read for those found neither in
        the old generation, the pending changes nor the in-flight commit. When none of the keys is
        in any of them (a cold batch) they are encoded, read, decoded and cached column-wise
        (:meth:`_read_cold`), else key by key (:meth:`_get_missed_each`, the reference)."""
        found: dict[Any, Any] = {}
        cache, dirty, inflight = self._cache, self._dirty, self._inflight
        if self._bulk_misses and not any(known and not known.keys().isdisjoint(ckeys)  # C-level passes
                                         for known in (cache.old, dirty, inflight)):
            if self._read_cold(ckeys, found):
                return found
        return self._get_missed_each(ckeys, found)

    def _read_cold(self, ckeys: list[Any], found: dict[Any, Any]) -> bool:
        """Read distinct cache keys held neither in the cache, the pending changes nor the in-flight
        commit with one backend read, caching and adding each value to ``found``, as
        :meth:`_get_missed_each` would, with no Python step per key for keys the backend does not
        hold. False (nothing done) when a key does not encode on the fast path or has a size the
        backend cannot hold: :meth:`_get_missed_each` then handles them (typed errors, sizes)."""
        if not ckeys:
            return True
        try:
            kbs = self._encode_keys(ckeys)
        except (*FAST_ERRORS, OverflowError):
            return False
        if not self._min_key <= min(map(len, kbs)) or max(map(len, kbs)) > self._max_key:
            return False
        if self._inflight and not self._backend.concurrent_reads:
            self._settle()
        try:
            stored = self._backend.get_many(kbs)
        except Exception as exc:
            raise self._backend_failed(exc) from exc
        stored = stored if type(stored) is list else list(stored)
        if stored.count(None) == len(stored):
            values = stored  # none held (first touch): nothing to decode
        else:
            decode = self._decode_stored
            values = [None if vb is None else decode(kb, vb) for kb, vb in zip(kbs, stored)]
        self._cache.insert_many(ckeys, values)
        found.update(zip(ckeys, values))
        return True

    def _get_missed_each(self, ckeys: list[Any], found: dict[Any, Any]) -> dict[Any, Any]:
        """:meth:`_get_missed_many`'s reference, key by key, adding each value to ``found`` (returned)."""
        cache = self._cache
        old, young, dirty, inflight = cache.old, cache.young, self._dirty, self._inflight
        fetch: list[tuple[Any, bytes]] = []
        for ckey in ckeys:
            value = old.pop(ckey, _MISS)
            if value is not _MISS:
                young[ckey] = value
                found[ckey] = value
                continue
            value = dirty.get(ckey, _MISS)
            if value is not _MISS:
                if value is not None and self._decode_held is not None:
                    value = self._decode_pending(ckey, value)
                cache.insert(ckey, value)
                found[ckey] = value
                continue
            kb = self._key_bytes(ckey)
            if not self._min_key <= len(kb) <= self._max_key:
                found[ckey] = None  # the backend cannot hold such a key: it cannot exist
                continue
            vb = inflight.get(ckey, _MISS) if inflight else _MISS
            if vb is _MISS:
                fetch.append((ckey, kb))
                continue
            value = None if vb is None else self._decode_stored(kb, vb)
            cache.insert(ckey, value)
            found[ckey] = value
        if fetch:
            if self._inflight and not self._backend.concurrent_reads:
                self._settle()
            try:
                stored = self._backend.get_many([kb for _, kb in fetch])
            except Exception as exc:
                raise self._backend_failed(exc) from exc
            for (ckey, kb), vb in zip(fetch, stored):
                value = None if vb is None else self._decode_stored(kb, vb)
                cache.insert(ckey, value)
                found[ckey] = value
        return found

    def _decode_stored(self, kb: bytes, vb: bytes) -> Any:
        try:
            return self._vde_fast(vb)
        except FAST_ERRORS:
            return self._decode_value(kb, vb)

    def _held_many(self, latest: dict[Any, Any]) -> dict[Any, Any]:
        """``{cache key: value as the pending map holds it}`` for the batch's surviving values, each
        checked (encoded) once, as :meth:`_held_value`; raises before anything is applied."""
        values = list(latest.values())
        kinds = set(map(type, values))
        if self._int_values and kinds <= {int} and (not values or (INT_MIN <= min(values) and max(values) <= INT_MAX)):
            return latest  # exact ints in range: held as objects, packed at the flush
        if type(None) in kinds:
            for key, value in latest.items():
                if value is None:
                    raise self._none_value(key)
        if self._hold_encoded:
            try:
                encoded = list(map(self._vfast, values))
            except FAST_ERRORS:
                encoded = [self._held_value(key, value) for key, value in latest.items()]
            return dict(zip(latest, encoded))
        return {key: self._held_value(key, value) for key, value in latest.items()}

    def _apply(self, latest: dict[Any, Any], held: dict[Any, Any]) -> None:
        """Write a checked batch: the objects into the cache, the held values into the pending map."""
        cache = self._cache
        young = cache.young
        if latest.keys() - young.keys():
            insert = cache.insert
            for ckey, value in latest.items():
                if ckey in young:
                    young[ckey] = value
                else:
                    insert(ckey, value)
        else:
            young.update(latest)
        dirty = self._dirty
        dirty.update(held)
        if len(dirty) > self._batch:
            self._spill()

    # -- iteration -------------------------------------------------------------------------------
    def range(self, start: Any = None, end: Any = None, reverse: bool = False) -> "KVIterator":
        """Entries with ``start <= key < end`` in serialized-key order (None: unbounded side)."""
        sb = None if start is None else self._ser_key(start)
        eb = None if end is None else self._ser_key(end)
        return self._iterate(sb, eb, reverse)

    def prefix(self, prefix: Any, reverse: bool = False) -> "KVIterator":
        """Entries whose serialized key starts with the serialized ``prefix``."""
        pb = self._ser_key(prefix)
        return self._iterate(pb or None, prefix_end(pb), reverse)

    def all(self, reverse: bool = False) -> "KVIterator":
        """Every entry, in key order."""
        return self._iterate(None, None, reverse)

    def _ser_key(self, key: Any) -> bytes:
        try:
            return self._kser(key)
        except SerdeError as exc:
            raise self._key_error(exc, key) from None

    def _iterate(self, start: bytes | None, end: bytes | None, reverse: bool) -> "KVIterator":
        if len(self._dirty) > SCAN_SPILL:
            self._spill()
        self._settle()  # the backend iterator must see every commit
        if (start is not None and end is not None and start >= end) or not self._dirty:
            pending: list[tuple[bytes, bytes | None]] = []
        else:
            pending = [(k, v) for k, v in self._pending_items(with_keys=False)[1]
                       if (start is None or k >= start) and (end is None or k < end)]
            if reverse:
                pending.reverse()
        iterator = KVIterator(self, pending, self._backend.iterate(start, end, reverse), reverse)
        self._iterators.add(iterator)
        return iterator

    def approximate_count(self) -> int:
        """Estimated number of keys (backend estimate adjusted by pending puts and deletes)."""
        pending = sum(1 if v is not None else -1 for v in self._dirty.values())
        self._settle()
        return max(0, self._backend.approximate_count() + pending)

    # -- the engine contract -------------------------------------------------------------------
    def restore(self, records: Iterable[ChangelogRecord]) -> None:
        """Apply changelog records in order (last per key wins), in atomic chunks; not re-logged."""
        self._settle()
        self._logged.restore(records, self._restore_batch, self._prepare_restored)

    def restore_columns(self, columns: Iterable[RecordColumns]) -> None:
        """:meth:`restore` from column runs (``core.engine.ColumnRestore``: recovery's bulk path)."""
        self._settle()
        self._logged.restore_columns(columns, self._restore_batch, self._prepare_restored)

    def _prepare_restored(self, chunk: Mapping[bytes, bytes | None]) -> Mapping[bytes, bytes | None]:
        """A restore chunk checked against the backend's key sizes, with its keys' cached and pending
        values dropped (the chunk supersedes them)."""
        if chunk and (self._min_key > 0 or self._max_key < 1 << 62):
            shortest, longest = key_sizes(chunk)
            if shortest < self._min_key or longest > self._max_key:
                chunk = self._check_restored_keys(chunk)
        cache, dirty = self._cache, self._dirty
        if len(cache) or dirty:
            for ckey in self._cache_keys(chunk):
                cache.discard(ckey)
                dirty.pop(ckey, None)
        return chunk

    def _cache_keys(self, kbs: Iterable[bytes]) -> Iterator[Any]:
        """The cache keys of serialized keys (those the key serde cannot decode cannot be cached)."""
        if self._key_class is _NoClass:
            yield from kbs
            return
        decode = self._kde_fast
        for kb in kbs:
            try:
                yield decode(kb)
            except FAST_ERRORS:
                continue

    def _check_restored_keys(self, chunk: Mapping[bytes, bytes | None]) -> dict[bytes, bytes | None]:
        """``chunk`` without tombstones of keys this backend cannot hold (such keys cannot exist);
        RestoreError for a value under such a key (e.g. a store switched to LMDB whose changelog holds
        empty keys or keys over 511 bytes): the restore could never succeed."""
        lo, hi = self._min_key, self._max_key
        kept: dict[bytes, bytes | None] = {}
        for kb, value in chunk.items():
            if lo <= len(kb) <= hi:
                kept[kb] = value
            elif value is not None:
                raise RestoreError(
                    f"the changelog of store {self._store!r} holds {a(len(kb))}-byte key {kb[:32]!r}; the "
                    f"{self._backend.name} backend holds keys of {lo}..{hi} bytes", key_size=len(kb),
                    hint=f"use backend = \"rocksdb\" for store {self._store!r} (it accepts any key size), "
                         f"or reset the job", **self._ctx())
        return kept

    def flush(self) -> None:
        """Encode and log pending changes (one record per key), flush the changelog, then write the
        changes and the new end offset to the backend in one atomic write (with ``write_behind``: on a
        background thread, readable through the in-flight map until it lands)."""
        behind = self._logged.background
        ckeys, items = self._pending_items(with_keys=behind)
        if self._logged.writing or self._inflight:
            self._settle()
        if behind:
            self._inflight.update(zip(ckeys, map(itemgetter(1), items)))  # type: ignore[arg-type]
        self._logged.commit(items, deletes=self._tombstones)
        self._dirty.clear()  # cleared in place: the C hot path holds this dict
        self._tombstones = False
        if behind and any(not it.closed for it in self._iterators):
            self._settle()  # open iterators take pre-images in write(): not while they advance

    def _settle(self) -> None:
        """Wait for the background backend write (write-behind), after which the backend holds every
        committed change, and forget the in-flight keys."""
        self._logged.settle()
        self._inflight.clear()

    def local_offset(self) -> int | None:
        """The changelog offset the backend's data reflects (None: no usable local state)."""
        return self._logged.local_offset()

    def close(self) -> None:
        """Close iterators and the backend. Unflushed changes are discarded. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for iterator in list(self._iterators):
            iterator.close()
        self._logged.close()
        self._cache.clear()
        self._dirty.clear()
        for name in _API:
            setattr(self, name, self._closed_call)

    def _closed_call(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreClosedError(f"store {self._store!r} is closed", hint="do not use a store after close(); "
                               "reopen it through its factory", **self._ctx())

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def backend(self) -> KVBackend:
        """The backend (for tests, tools and benchmarks)."""
        return self._backend


class KVIterator(Iterator[tuple[Any, Any]]):
    """Snapshot iterator over the merged view: pending writes captured at open + backend snapshot.

    Closable, a context manager, and closed automatically when exhausted, garbage collected, or
    when its store closes. Yields deserialized ``(key, value)`` pairs.
    """

    def __init__(self, engine: KeyValueEngine, pending: list[tuple[bytes, bytes | None]],
                 backend_iter: BackendIterator, reverse: bool) -> None:
        self._engine = engine
        self._pending = pending
        self._pi = 0
        self._bit = backend_iter
        self._head: tuple[bytes, bytes] | None | object = _MISS
        self._reverse = reverse
        self._closed = False

    def __iter__(self) -> "KVIterator":
        return self

    def __next__(self) -> tuple[Any, Any]:
        engine = self._engine
        while True:
            if self._closed:
                if engine._closed:
                    raise StoreClosedError(f"store {engine._store!r} was closed during iteration",
                                           hint="finish or close iterators before closing the store",
                                           **engine._ctx())
                raise StopIteration
            pending = self._pending[self._pi] if self._pi < len(self._pending) else None
            head = self._head
            if head is _MISS:
                head = self._head = next(self._bit, None)
            if pending is None and head is None:
                self.close()
                raise StopIteration
            if head is None or (pending is not None and (
                    pending[0] == head[0] or ((pending[0] > head[0]) if self._reverse else (pending[0] < head[0])))):
                if head is not None and pending[0] == head[0]:  # type: ignore[index]
                    self._head = _MISS
                self._pi += 1
                kb, vb = pending  # type: ignore[misc]
                if vb is None:
                    continue  # deleted, not yet flushed
            else:
                kb, vb = head  # type: ignore[misc]
                self._head = _MISS
            return engine._decode_key(kb), engine._decode_value(kb, vb)

    def close(self) -> None:
        """Release the iterator's resources (idempotent)."""
        if not self._closed:
            self._closed = True
            self._pending = []
            self._bit.close()

    def __enter__(self) -> "KVIterator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass
