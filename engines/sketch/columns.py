"""The sketch engine's typed columns for the state reader (docs/state-reader.md): one row per sketch,
rebuilt from the unit records the engine logs (:mod:`localstate.engines.sketch.keys`) and queried
with the engine's own estimators, so a row says what the store's query API says.

* ``hll``: ``name, kind, estimate, sketch``: ``sketch`` is ``datasketch.HyperLogLog``'s
  serialization (``HyperLogLog.deserialize(bytes(row.sketch))`` loads it; precision byte, then the
  registers);
* ``bloom``: ``name, kind, estimate, bits_set``;
* ``quantiles``: ``name, kind, count, quantiles`` (at :data:`QUANTILE_RANKS`), ``sketch`` (the
  engine's KLL serialization, ``localstate.engines.sketch.KllSketch.from_bytes``: datasketch has no
  KLL sketch).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import numpy as np

from localstate.core.engine import SerdeColumn, StateColumns
from localstate.engines.sketch.bloom import BloomFilter, bloom_size
from localstate.engines.sketch.hll import HyperLogLog
from localstate.engines.sketch.keys import split_key
from localstate.engines.sketch.kll import KllSketch

__all__ = ["sketch_columns", "QUANTILE_RANKS", "datasketch_bytes"]

QUANTILE_RANKS = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
"""The ranks of a quantile sketch's ``quantiles`` column (0.0: the minimum, 1.0: the maximum)."""


def datasketch_bytes(registers: np.ndarray) -> bytes:
    """``datasketch.HyperLogLog.serialize`` of these registers: the precision byte, then one byte per
    register."""
    precision = int(registers.size).bit_length() - 1
    return bytes([precision]) + registers.astype(np.uint8).tobytes()


def _units(entries: list[tuple[bytes, bytes]]) -> dict[bytes, list[tuple[bytes, bytes]]]:
    """The records grouped by sketch name (serialized), in name order; the layout record dropped."""
    sketches: dict[bytes, list[tuple[bytes, bytes]]] = {}
    for key, value in entries:
        parsed = split_key(key)
        if parsed is not None:
            sketches.setdefault(parsed[0], []).append((parsed[1], value))
    return dict(sorted(sketches.items()))


def _array(units: list[tuple[bytes, bytes]], size: int, dtype: str, width: int, into: Any) -> np.ndarray:
    """The unit array of one sketch: zeros, then each record's unit (u32 index suffix, ``width`` bytes)."""
    array = np.zeros(size, dtype=into)
    if units:
        indexes = np.frombuffer(b"".join(suffix for suffix, _ in units), dtype=">u4").astype(np.int64)
        array[indexes] = np.frombuffer(b"".join(value for _, value in units), dtype=dtype).astype(into)
    return array


def sketch_columns(options: Mapping[str, Any], key: SerdeColumn) -> StateColumns:
    """The columns of a store of ``options["kind"]`` (validated options); ``name`` is the sketch
    name through the key serde."""
    kind = options["kind"]
    if kind == "hll":
        precision, hash_name = int(options.get("precision") or 12), str(options.get("hash") or "datasketch")

        def hll_rows(entries: list[tuple[bytes, bytes]]) -> Iterator[tuple]:
            for name, units in _units(entries).items():
                registers = _array(units, 1 << precision, "u1", 1, np.int8)
                yield (key.decode(name), kind, HyperLogLog(precision, hash_name, registers).count(),
                       datasketch_bytes(registers))

        return StateColumns(f"name {key.type}, kind string, estimate double, sketch binary", hll_rows)
    if kind == "bloom":
        bits, hashes = bloom_size(int(options.get("capacity") or 1_000_000), float(options.get("error_rate") or 0.01))
        hash_name = str(options.get("hash") or "fast")

        def bloom_rows(entries: list[tuple[bytes, bytes]]) -> Iterator[tuple]:
            for name, units in _units(entries).items():
                bloom = BloomFilter(bits, hashes, hash_name, _array(units, bits // 64, "<u8", 8, np.uint64))
                yield key.decode(name), kind, bloom.estimated_count(), bloom.bits_set()

        return StateColumns(f"name {key.type}, kind string, estimate double, bits_set bigint", bloom_rows)

    def quantile_rows(entries: list[tuple[bytes, bytes]]) -> Iterator[tuple]:
        for name, units in _units(entries).items():
            whole = dict(units).get(b"")
            if whole is None:
                continue
            sketch = KllSketch.from_bytes(whole)
            yield (key.decode(name), kind, int(sketch.n),
                   [float(q) for q in sketch.quantiles(np.asarray(QUANTILE_RANKS))], bytes(whole))

    return StateColumns(f"name {key.type}, kind string, count bigint, quantiles array<double>, sketch binary",
                        quantile_rows)
