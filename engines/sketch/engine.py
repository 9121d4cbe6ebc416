"""The sketch engine: named HyperLogLog, Bloom filter or KLL quantile sketches in one store.

Each sketch lives in memory (numpy arrays). Persistence and fault tolerance come from the
logged-store layer (:mod:`localstate.core.logged`) over a backend plugin in the store's directory:
at :meth:`SketchEngine.flush` only the *changed units* are handed to it (HLL: one record per changed
register, Bloom: one per changed 64-bit word, quantiles: the serialised sketch), which logs them and
commits them atomically with its local offset. So the changelog logs deltas, never inputs, and
compacts to at most one record per unit.

Sketches are loaded lazily from the backend (one prefix scan) on first use.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from abc import abstractmethod
from operator import itemgetter
from typing import Any, ClassVar, Generic, Iterable, Iterator, TypeVar

import numpy as np
from datasketch import HyperLogLog as DatasketchHLL

from localstate.core.backend import BackendIterator, prefix_end
from localstate.core.changelog import ChangelogRecord, RecordColumns
from localstate.core.engine import StorageEngine, StoreContext
from localstate.core.logged import LoggedStore
from localstate.core.serdes import BytesSerde
from localstate.engines.sketch.bloom import BloomFilter
from localstate.engines.sketch.hll import HyperLogLog, hash32_function
from localstate.engines.sketch.keys import META_KEY, name_prefix, split_key, unit_indexes, unit_keys
from localstate.engines.sketch.kll import KllSketch, rank_error
from localstate.errors import InvalidValueError, RestoreError, StoreClosedError, StoreError

__all__ = ["SketchEngine", "HyperLogLogEngine", "BloomFilterEngine", "QuantilesEngine"]

log = logging.getLogger(__name__)

S = TypeVar("S")


class SketchEngine(StorageEngine, Generic[S]):
    """Base of the three sketch stores: naming, lazy loading, dirty tracking, flush and restore.

    Guarantees: the changelog holds one record per changed unit per flush; restore applies records
    last-wins to loaded sketches and leaves the others to be loaded from the backend, so restored
    sketches are bit-for-bit the logged ones.
    """

    kind: ClassVar[str] = ""

    def __init__(self, context: StoreContext, logged: LoggedStore, layout: dict[str, Any], *,
                 restore_batch_size: int = 10_000) -> None:
        super().__init__(context)
        self._logged = logged
        self._backend = logged.backend
        self._restore_batch = restore_batch_size
        self._layout = {"kind": self.kind, **layout}
        self._sketches: dict[bytes, S] = {}
        self._dirty: set[bytes] = set()
        self._closed = False
        self._meta_stored = self._check_meta(StoreError)

    # -- names -------------------------------------------------------------------------------
    def _name(self, name: Any) -> bytes:
        serde = self.context.key_serde
        if isinstance(serde, BytesSerde) and isinstance(name, str):
            # The runtime's default key serde is bytes; let str names work there too (as UTF-8).
            return name.encode("utf-8")
        return serde.serialize(name)

    def names(self) -> list[Any]:
        """Names of the non-empty sketches (flushed or not), ordered by their serialised bytes."""
        self._check_open()
        found: set[bytes] = set()
        with self._scan(None) as entries:
            for key, _ in entries:
                parsed = split_key(key)
                if parsed is not None:
                    found.add(parsed[0])
        for name, sketch in self._sketches.items():
            if self._is_empty(sketch):
                found.discard(name)
            else:
                found.add(name)
        return [self.context.key_serde.deserialize(n) for n in sorted(found)]

    def exists(self, name: Any) -> bool:
        """Whether the sketch ``name`` holds anything."""
        sketch = self._get(self._name(name), create=False)
        return sketch is not None and not self._is_empty(sketch)

    def delete(self, name: Any) -> None:
        """Empty the sketch ``name`` (its records are tombstoned at the next flush)."""
        key = self._name(name)
        sketch = self._get(key, create=False)
        if sketch is not None:
            self._clear(sketch)
            self._dirty.add(key)

    # -- loading -----------------------------------------------------------------------------
    def _get(self, name: bytes, create: bool = True) -> S | None:
        self._check_open()
        sketch = self._sketches.get(name)
        if sketch is None:
            prefix = name_prefix(name)
            with self._scan(prefix) as entries:
                records = list(entries)
            if records:
                try:
                    sketch = self._load(name, prefix, records)
                except (ValueError, IndexError) as exc:
                    raise StoreError(f"sketch {name!r:.80} is corrupt in the local store: {exc}",
                                     hint="delete the store's local directory so it is rebuilt from the changelog",
                                     **self.context.describe()) from exc
            elif create:
                sketch = self._new(name, prefix)
            else:
                return None
            self._sketches[name] = sketch
        return sketch

    def _scan(self, prefix: bytes | None) -> BackendIterator:
        """A snapshot iterator over the local units (of the sketch whose keys start with ``prefix``)."""
        try:
            return self._backend.iterate(prefix, None if prefix is None else prefix_end(prefix))
        except Exception as exc:
            raise self._logged.failed(exc) from exc

    def _sketch_for_update(self, name: Any) -> S:
        key = self._name(name)
        sketch = self._get(key)
        self._dirty.add(key)
        return sketch  # type: ignore[return-value]

    # -- engine contract ---------------------------------------------------------------------
    def flush(self) -> None:
        self._check_open()
        changes: dict[bytes, bytes | None] = {}
        if not self._meta_stored:
            changes[META_KEY] = json.dumps(self._layout, sort_keys=True).encode()
        puts: list[tuple[bytes, bytes]] = []
        deletes: list[bytes] = []
        for name in sorted(self._dirty):
            self._changes(self._sketches[name], puts, deletes)
        changes.update(puts)
        changes.update(dict.fromkeys(deletes))
        self._check_key_sizes(changes)
        self._logged.commit(sorted(changes.items(), key=itemgetter(0)), deletes=bool(deletes))
        self._meta_stored = True
        self._dirty.clear()

    def _check_key_sizes(self, changes: dict[bytes, bytes | None]) -> None:
        """InvalidValueError, before anything is logged, for a key the backend cannot hold (a
        logged but unwritable record would break every restore)."""
        lo = getattr(self._backend, "min_key_size", 0)
        hi = getattr(self._backend, "max_key_size", 1 << 62)
        for key in changes:
            if not lo <= len(key) <= hi:
                raise InvalidValueError(
                    f"sketch key {key[:64]!r} is {len(key)} bytes; the {self._backend.name} backend accepts "
                    f"{lo}..{hi} bytes", hint="use shorter sketch names or the rocksdb backend",
                    **self.context.describe())

    def restore(self, records: Iterable[ChangelogRecord]) -> None:
        self._check_open()
        loaded = self._sketches
        updates: dict[bytes, dict[bytes, bytes | None]] = {}
        if not loaded:
            self._logged.restore(records, self._restore_batch)
        else:
            def tap() -> Iterator[ChangelogRecord]:
                for record in records:
                    yield record
                    self._note_update(updates, record.key, record.value)

            self._logged.restore(tap(), self._restore_batch)
        self._finish_restore(updates)

    def restore_columns(self, columns: Iterable[RecordColumns]) -> None:
        """:meth:`restore` from column runs (``core.engine.ColumnRestore``): the units go to the
        backend's bulk load; only records of sketches loaded in memory are looked at one by one."""
        self._check_open()
        updates: dict[bytes, dict[bytes, bytes | None]] = {}
        if self._sketches:
            def tap(runs: Iterable[RecordColumns]) -> Iterator[RecordColumns]:
                for run in runs:
                    yield run
                    for key, value in zip(run.keys, run.values):
                        self._note_update(updates, key, value)

            columns = tap(columns)
        self._logged.restore_columns(columns, self._restore_batch)
        self._finish_restore(updates)

    def _note_update(self, updates: dict[bytes, dict[bytes, bytes | None]], key: bytes, value: bytes | None) -> None:
        """Remember a restored unit of a sketch loaded in memory (applied by :meth:`_finish_restore`)."""
        parsed = split_key(key)
        if parsed is not None and parsed[0] in self._sketches:
            updates.setdefault(parsed[0], {})[parsed[1]] = value

    def _finish_restore(self, updates: dict[bytes, dict[bytes, bytes | None]]) -> None:
        """Apply the restored units to the loaded sketches (last per unit wins) and re-check the meta."""
        loaded = self._sketches
        for name, changes in updates.items():
            try:
                self._apply(loaded[name], changes)
            except (ValueError, IndexError) as exc:
                raise RestoreError(f"changelog records of sketch {name!r:.80} do not fit this store: {exc}",
                                   hint="check that the store's kind and parameters match the changelog",
                                   **self.context.describe()) from exc
        self._meta_stored = self._check_meta(RestoreError)

    def local_offset(self) -> int | None:
        self._check_open()
        return self._logged.local_offset()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._sketches.clear()
        self._dirty.clear()
        self._logged.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the sketch store is closed", hint="open the store again",
                                   **self.context.describe())

    def _check_meta(self, error: type[StoreError] | type[RestoreError]) -> bool:
        try:
            raw = self._backend.get(META_KEY)
        except Exception as exc:
            raise self._logged.failed(exc) from exc
        if raw is None:
            return False
        try:
            stored = json.loads(raw)
        except ValueError:
            stored = {"unreadable layout record": raw[:64].hex()}
        if stored != self._layout:
            raise error(f"the store holds sketches laid out as {json.dumps(stored, sort_keys=True)} but is "
                        f"configured for {json.dumps(self._layout, sort_keys=True)}",
                        hint="restore the previous options, or use a new store name (sketches cannot be "
                             "converted between kinds or parameters)", **self.context.describe())
        return True

    # -- per kind ----------------------------------------------------------------------------
    @abstractmethod
    def _new(self, name: bytes, prefix: bytes) -> S: ...

    @abstractmethod
    def _load(self, name: bytes, prefix: bytes, records: list[tuple[bytes, bytes]]) -> S: ...

    @abstractmethod
    def _changes(self, sketch: S, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None: ...

    @abstractmethod
    def _apply(self, sketch: S, changes: dict[bytes, bytes | None]) -> None: ...

    @abstractmethod
    def _is_empty(self, sketch: S) -> bool: ...

    @abstractmethod
    def _clear(self, sketch: S) -> None: ...


@dataclasses.dataclass
class _Units:
    """A unit-array sketch plus the unit values the backend holds (``base``)."""

    prefix: bytes
    sketch: Any
    base: np.ndarray

    @property
    def data(self) -> np.ndarray:
        return self.sketch.reg if isinstance(self.sketch, HyperLogLog) else self.sketch.words


class _UnitStore(SketchEngine[_Units]):
    """Sketches made of fixed-size units (HLL registers, Bloom words) keyed ``prefix + u32 index``."""

    _dtype: ClassVar[str]  # little-endian storage dtype of one unit
    _width: ClassVar[int]

    def _sketch(self, data: np.ndarray | None) -> Any:
        raise NotImplementedError

    def _new(self, name: bytes, prefix: bytes) -> _Units:
        units = _Units(prefix, self._sketch(None), np.empty(0))
        units.base = np.zeros_like(units.data)
        return units

    def _load(self, name: bytes, prefix: bytes, records: list[tuple[bytes, bytes]]) -> _Units:
        units = self._new(name, prefix)
        keys = [k for k, _ in records]
        values = [v for _, v in records]
        self._set(units, keys, values)
        return units

    def _set(self, units: _Units, keys: list[bytes], values: list[bytes | None]) -> None:
        data = units.data
        if any(len(k) != len(units.prefix) + 4 for k in keys):
            raise ValueError("unexpected key length")
        indexes = unit_indexes(keys)
        if indexes.size and int(indexes.max()) >= data.size:
            raise ValueError(f"unit index {int(indexes.max())} out of range (sketch has {data.size} units)")
        zero = b"\0" * self._width
        raw = b"".join(zero if v is None else v for v in values)
        if len(raw) != self._width * len(values):
            raise ValueError(f"unit values must be {self._width} bytes")
        decoded = np.frombuffer(raw, dtype=self._dtype).astype(data.dtype)
        data[indexes] = decoded
        units.base[indexes] = decoded

    def _apply(self, units: _Units, changes: dict[bytes, bytes | None]) -> None:
        # ``changes`` already keeps the last record per key, so indexes are unique.
        self._set(units, list(units.prefix + s for s in changes), list(changes.values()))

    def _changes(self, units: _Units, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
        data, base = units.data, units.base
        changed = np.flatnonzero(data != base)
        if changed.size == 0:
            return
        values = data[changed]
        nonzero = values != 0
        put_index = changed[nonzero]
        raw = values[nonzero].astype(self._dtype).tobytes()
        width = self._width
        puts.extend(zip(unit_keys(units.prefix, put_index), [raw[i:i + width] for i in range(0, len(raw), width)]))
        # A unit back at zero (delete, or a replacing import) is a tombstone: zero is the default.
        deletes.extend(unit_keys(units.prefix, changed[~nonzero]))
        base[changed] = values

    def _is_empty(self, units: _Units) -> bool:
        return not units.data.any()

    def _clear(self, units: _Units) -> None:
        units.data[:] = 0


class HyperLogLogEngine(_UnitStore):
    """Named HyperLogLog sketches with datasketch-compatible registers.

    ``add(name, item)`` / ``add_many(name, items)`` / ``count(name)`` / ``merge(into, *sources)`` /
    ``to_datasketch(name)`` / ``from_datasketch(name, hll)``. Items are str/bytes/int
    (see :mod:`localstate.engines.sketch.hashing`).
    """

    kind = "hll"
    _dtype = "u1"
    _width = 1

    def __init__(self, context: StoreContext, logged: LoggedStore, precision: int, hash: str,
                 **store_options: Any) -> None:
        self.precision = precision
        self.hash = hash
        super().__init__(context, logged, {"precision": precision, "hash": hash}, **store_options)

    def _sketch(self, data: np.ndarray | None) -> HyperLogLog:
        return HyperLogLog(self.precision, self.hash, data)

    @property
    def standard_error(self) -> float:
        """Relative standard error of :meth:`count`: 1.04 / sqrt(2**precision)."""
        return 1.04 / float(np.sqrt(1 << self.precision))

    def add(self, name: Any, item: Any) -> None:
        units = self._sketch_for_update(name)
        units.sketch.add(item)

    def add_many(self, name: Any, items: Iterable[Any]) -> None:
        """Add many items; hashing and register updates are vectorised."""
        units = self._sketch_for_update(name)
        units.sketch.add_many(items if isinstance(items, (list, tuple, np.ndarray)) else list(items))

    def count(self, name: Any) -> float:
        """Estimated number of distinct items (datasketch's estimator); 0.0 for an unknown sketch."""
        units = self._get(self._name(name), create=False)
        return 0.0 if units is None else units.sketch.count()

    def registers(self, name: Any) -> np.ndarray:
        """A copy of the int8 registers (zeros for an unknown sketch)."""
        units = self._get(self._name(name), create=False)
        return np.zeros(1 << self.precision, dtype=np.int8) if units is None else units.data.copy()

    def merge(self, into: Any, *sources: Any) -> None:
        """Union ``sources`` (sketch names in this store, or ``datasketch.HyperLogLog``) into ``into``."""
        regs = [self._source_registers(s) for s in sources]
        units = self._sketch_for_update(into)
        for reg in regs:
            units.sketch.merge(reg)

    def _source_registers(self, source: Any) -> np.ndarray:
        if hasattr(source, "reg") and hasattr(source, "p"):
            self._check_datasketch(source)
            return np.asarray(source.reg, dtype=np.int8)
        return self.registers(source)

    def _check_datasketch(self, hll: Any) -> None:
        if hll.p != self.precision:
            raise InvalidValueError(f"cannot use a HyperLogLog of precision {hll.p} in a store of precision "
                                    f"{self.precision}", hint=f"build it with HyperLogLog(p={self.precision})",
                                    **self.context.describe())
        expected = hash32_function(self.hash)
        if getattr(hll, "hashfunc", expected) is not expected:
            raise InvalidValueError(f"the HyperLogLog uses hashfunc {hll.hashfunc!r}, this store hashes with "
                                    f"{expected.__module__}.{expected.__name__} (hash = {self.hash!r})",
                                    hint="registers built with another hash cannot be combined",
                                    **self.context.describe())

    def to_datasketch(self, name: Any) -> Any:
        """A ``datasketch.HyperLogLog`` with this sketch's precision, registers and hash function."""
        return DatasketchHLL(reg=self.registers(name), hashfunc=hash32_function(self.hash))

    def from_datasketch(self, name: Any, hll: Any) -> None:
        """Replace sketch ``name`` with the registers of a ``datasketch.HyperLogLog`` (same p and hash)."""
        self._check_datasketch(hll)
        units = self._sketch_for_update(name)
        units.data[:] = np.asarray(hll.reg, dtype=np.int8)


class BloomFilterEngine(_UnitStore):
    """Named Bloom filters sized from ``capacity`` and ``error_rate``.

    ``add`` / ``add_many`` / ``contains`` / ``contains_many`` / ``merge``. Never a false negative.
    """

    kind = "bloom"
    _dtype = "<u8"
    _width = 8

    def __init__(self, context: StoreContext, logged: LoggedStore, capacity: int, error_rate: float, bits: int,
                 hashes: int, hash: str, **store_options: Any) -> None:
        self.capacity = capacity
        self.error_rate = error_rate
        self.bits = bits
        self.hashes = hashes
        self.hash = hash
        super().__init__(context, logged, {"bits": bits, "hashes": hashes, "hash": hash}, **store_options)

    def _sketch(self, data: np.ndarray | None) -> BloomFilter:
        return BloomFilter(self.bits, self.hashes, self.hash, data)

    def add(self, name: Any, item: Any) -> None:
        self._sketch_for_update(name).sketch.add(item)

    def add_many(self, name: Any, items: Iterable[Any]) -> None:
        self._sketch_for_update(name).sketch.add_many(
            items if isinstance(items, (list, tuple, np.ndarray)) else list(items))

    def contains(self, name: Any, item: Any) -> bool:
        """False: certainly never added. True: probably added (false-positive rate ~ error_rate)."""
        units = self._get(self._name(name), create=False)
        return units is not None and units.sketch.contains(item)

    def contains_many(self, name: Any, items: Iterable[Any]) -> np.ndarray:
        items = items if isinstance(items, (list, tuple, np.ndarray)) else list(items)
        units = self._get(self._name(name), create=False)
        if units is None:
            return np.zeros(len(items), dtype=bool)
        return units.sketch.contains_many(items)

    def words(self, name: Any) -> np.ndarray:
        """A copy of the uint64 bit words (zeros for an unknown filter)."""
        units = self._get(self._name(name), create=False)
        return np.zeros(self.bits // 64, dtype=np.uint64) if units is None else units.data.copy()

    def merge(self, into: Any, *sources: Any) -> None:
        """Union the filters ``sources`` (names in this store) into ``into``."""
        words = [self.words(s) for s in sources]
        units = self._sketch_for_update(into)
        for w in words:
            units.sketch.merge(w)

    def estimated_count(self, name: Any) -> float:
        """Distinct items added, estimated from the fill ratio."""
        units = self._get(self._name(name), create=False)
        return 0.0 if units is None else units.sketch.estimated_count()


@dataclasses.dataclass
class _Quantiles:
    prefix: bytes
    sketch: KllSketch
    deleted: bool = False


class QuantilesEngine(SketchEngine[_Quantiles]):
    """Named KLL quantile sketches of float values.

    ``add`` / ``add_many`` / ``quantile(name, q)`` / ``quantiles(name, qs)`` / ``rank(name, x)`` /
    ``cdf(name, points)`` / ``merge``. Rank error <= :attr:`rank_error` (99% confidence).
    One changelog record per changed sketch per flush: its serialised state (~8 bytes * 3k).
    """

    kind = "quantiles"

    def __init__(self, context: StoreContext, logged: LoggedStore, k: int, **store_options: Any) -> None:
        self.k = k
        super().__init__(context, logged, {"k": k}, **store_options)

    @property
    def rank_error(self) -> float:
        """Normalised rank error bound for this ``k`` (DataSketches' fit, 99% confidence)."""
        return rank_error(self.k)

    @staticmethod
    def _seed(name: bytes) -> int:
        return int.from_bytes(hashlib.sha1(name).digest()[:8], "little")

    def _new(self, name: bytes, prefix: bytes) -> _Quantiles:
        return _Quantiles(prefix, KllSketch(self.k, self._seed(name)))

    def _load(self, name: bytes, prefix: bytes, records: list[tuple[bytes, bytes]]) -> _Quantiles:
        for key, value in records:
            if key == prefix:
                return _Quantiles(prefix, self._decode(value))
        return self._new(name, prefix)

    def _decode(self, value: bytes) -> KllSketch:
        sketch = KllSketch.from_bytes(value)
        if sketch.k != self.k:
            raise ValueError(f"sketch has k={sketch.k}, store has k={self.k}")
        return sketch

    def _changes(self, entry: _Quantiles, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
        if entry.sketch.n:
            puts.append((entry.prefix, entry.sketch.to_bytes()))
        elif entry.deleted:
            deletes.append(entry.prefix)
        entry.deleted = False

    def _apply(self, entry: _Quantiles, changes: dict[bytes, bytes | None]) -> None:
        if b"" not in changes:
            return
        value = changes[b""]
        entry.sketch = KllSketch(self.k, entry.sketch.seed) if value is None else self._decode(value)
        entry.deleted = False

    def _is_empty(self, entry: _Quantiles) -> bool:
        return entry.sketch.n == 0

    def _clear(self, entry: _Quantiles) -> None:
        entry.sketch = KllSketch(self.k, entry.sketch.seed)
        entry.deleted = True

    def add(self, name: Any, value: float) -> None:
        self._sketch_for_update(name).sketch.add(value)

    def add_many(self, name: Any, values: Iterable[float]) -> None:
        """Add many values (numpy-vectorised; NaN ignored). Same state as adding them one by one."""
        try:
            array = np.asarray(values if isinstance(values, (list, tuple, np.ndarray)) else list(values),
                               dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InvalidValueError(f"quantile sketches take numbers: {exc}", hint="convert values to float",
                                    **self.context.describe()) from exc
        self._sketch_for_update(name).sketch.add_many(array)

    def _read(self, name: Any) -> KllSketch | None:
        entry = self._get(self._name(name), create=False)
        return None if entry is None else entry.sketch

    def count(self, name: Any) -> int:
        """Number of values added."""
        sketch = self._read(name)
        return 0 if sketch is None else sketch.n

    def quantile(self, name: Any, q: float) -> float:
        """Approximate q-quantile (inclusive); NaN for an empty sketch."""
        sketch = self._read(name)
        return float("nan") if sketch is None else sketch.quantile(q)

    def quantiles(self, name: Any, qs: Iterable[float]) -> np.ndarray:
        sketch = self._read(name)
        qs = np.asarray(list(qs) if not isinstance(qs, np.ndarray) else qs, dtype=np.float64)
        return np.full(qs.shape, np.nan) if sketch is None else sketch.quantiles(qs)

    def rank(self, name: Any, value: float) -> float:
        """Approximate fraction of values <= ``value``; NaN for an empty sketch."""
        sketch = self._read(name)
        return float("nan") if sketch is None else sketch.rank(value)

    def cdf(self, name: Any, points: Iterable[float]) -> np.ndarray:
        points = np.asarray(list(points) if not isinstance(points, np.ndarray) else points, dtype=np.float64)
        sketch = self._read(name)
        return np.full(points.shape, np.nan) if sketch is None else sketch.cdf(points)

    def serialized(self, name: Any) -> bytes:
        """The exact serialised state of sketch ``name`` (what the changelog records)."""
        sketch = self._read(name)
        return (sketch or KllSketch(self.k, self._seed(self._name(name)))).to_bytes()

    def sketch(self, name: Any) -> KllSketch:
        """A copy of the sketch (e.g. to merge into another store or inspect levels)."""
        return KllSketch.from_bytes(self.serialized(name))

    def merge(self, into: Any, *sources: Any) -> None:
        """Merge ``sources`` (names in this store, or :class:`KllSketch` objects) into ``into``."""
        others = [s if isinstance(s, KllSketch) else self.sketch(s) for s in sources]
        target = self._sketch_for_update(into).sketch
        for other in others:
            target.merge(other)

