"""The columns of a savepoint's Parquet files.

Every store's files have ``key_bytes`` and ``value_bytes`` (binary): the changelog's records exactly,
the engine-neutral form every kind restores from (a ttl store's values keep their expiry stamp; heaps,
sketches and search indexes their own record formats). Beside them, decoded columns where the
store's serdes allow, typed as the state reader types them (``int`` -> int64, ``string`` -> string,
``bytes`` -> binary, any other serde -> JSON text): ``key`` for a kv, heap or search store (the key,
item or document id), ``value`` for a kv store, and ``expiry`` (seconds since the epoch; null: never)
for a kv store with ``ttl``. The other engines' typed columns (a sketch's estimate, a heap's score)
are what ``spark.read.format("localstate").option("savepoint", PATH)`` shows.

The decoded columns of the ``int``, ``string`` and ``bytes`` serdes are made a whole file at a time
in Arrow (UTF-8 checked by Arrow's cast, ints by numpy); a file where that fails is decoded record by
record, which names the record its serde refuses.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from localstate.core.config import JobConfig, StoreConfig
from localstate.core.serdes import BytesSerde, IntSerde, Serde, StringSerde
from localstate.runtime.driver.views import serde_column, store_serdes, value_splitter

__all__ = ["StoreColumns", "store_columns", "to_parquet", "from_parquet", "RAW"]

RAW = ("key_bytes", "value_bytes")
_ARROW = {"bigint": pa.int64(), "string": pa.string(), "binary": pa.binary()}
_SIGN = np.uint64(1 << 63)

Batch = Callable[[pa.Array], pa.Array]
"""A whole column decoded at once: the binary array of the records' keys (or values) -> the decoded
array; it raises when any record does not decode (then the records are decoded one by one)."""


@dataclass(frozen=True)
class StoreColumns:
    """The decoded columns of one store: ``(name, arrow type, decode)`` each, ``decode`` taking a
    record's ``(key, value)`` bytes; ``batches``: for each, None or the column decoded at once
    (:data:`Batch`, given ``(keys, values)`` as binary arrays)."""

    decoded: tuple[tuple[str, pa.DataType, Callable[[bytes, bytes], Any]], ...]
    batches: tuple[Callable[[pa.Array, pa.Array], pa.Array] | None, ...] = ()

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.decoded]

    def schema(self) -> pa.Schema:
        return pa.schema([(RAW[0], pa.binary()), (RAW[1], pa.binary()),
                          *((name, kind) for name, kind, _ in self.decoded)])


def store_columns(job: JobConfig, config: StoreConfig) -> StoreColumns:
    """The decoded columns of ``config``'s records (see the module docstring)."""
    if config.engine not in ("kv", "heap", "search") or config.name.startswith("_"):
        return StoreColumns(())
    key_serde, value_serde = store_serdes(job, config)
    key = serde_column(key_serde, config.key_serde, config.name)
    decoded: list[tuple[str, pa.DataType, Callable[[bytes, bytes], Any]]] = [
        ("key", _ARROW[key.type], lambda k, v, decode=key.decode: decode(k))]
    key_batch = _batch(key_serde, config.key_serde)
    batches: list[Callable[[pa.Array, pa.Array], pa.Array] | None] = [
        None if key_batch is None else lambda ks, vs, batch=key_batch: batch(ks)]
    if config.engine == "kv":
        value = serde_column(value_serde, config.value_serde, config.name)
        split = value_splitter(job, config)
        if split is None:
            decoded.append(("value", _ARROW[value.type], lambda k, v, decode=value.decode: decode(v)))
            value_batch = _batch(value_serde, config.value_serde)
            batches.append(None if value_batch is None else lambda ks, vs, batch=value_batch: batch(vs))
        else:
            decoded.append(("value", _ARROW[value.type], lambda k, v, decode=value.decode: decode(split(v)[0])))
            decoded.append(("expiry", pa.float64(), lambda k, v: _finite(split(v)[1])))
            batches += [None, None]
    return StoreColumns(tuple(decoded), tuple(batches))


def _batch(serde: Serde | None, name: str) -> Batch | None:
    """The column decoded at once for the built-in ``string``, ``bytes`` and ``int`` serdes (the
    decode of :func:`~localstate.runtime.driver.views.serde_column`, the same values); None for
    any other (a subclass may decode otherwise)."""
    kind = type(serde)
    if name == "bytes" and kind is BytesSerde:
        return lambda data: data
    if name == "string" and kind is StringSerde:
        return lambda data: data.cast(pa.string())  # checks every value is UTF-8 (ArrowInvalid if not)
    if name == "int" and kind is IntSerde:
        return _ints
    return None


def _ints(data: pa.Array) -> pa.Array:
    """The ``int`` serde's 8 big-endian bytes, sign bit flipped, as int64 (ValueError for a record of
    another length)."""
    if data.null_count or not len(data):
        raise ValueError("no batch for nulls or no records")
    offsets = np.frombuffer(data.buffers()[1], dtype=np.int32, count=len(data) + 1, offset=data.offset * 4)
    if offsets[-1] - offsets[0] != 8 * len(data) or np.any(np.diff(offsets) != 8):
        raise ValueError("an int record that is not 8 bytes")
    raw = np.frombuffer(data.buffers()[2], dtype=">u8", count=len(data), offset=int(offsets[0]))
    return pa.array((raw ^ _SIGN).astype(np.uint64).view(np.int64))


def _finite(expiry: float | None) -> float | None:
    return None if expiry is None or math.isinf(expiry) else expiry


def to_parquet(keys: list[bytes], values: list[bytes], columns: StoreColumns, compression: str = "zstd") -> bytes:
    """One Parquet file of records (keys in byte order) with their decoded columns, compressed with
    ``compression`` (a Parquet codec: savepoints use zstd)."""
    arrays = [pa.array(keys, pa.binary()), pa.array(values, pa.binary())]
    batches = columns.batches or (None,) * len(columns.decoded)
    for (_name, kind, decode), batch in zip(columns.decoded, batches):
        column = None
        if batch is not None:
            try:
                column = batch(arrays[0], arrays[1])
            except Exception:  # noqa: BLE001 - decoded record by record below, which names the bad one
                column = None
        if column is None:
            column = pa.array([decode(k, v) for k, v in zip(keys, values)], kind)
        arrays.append(column)
    table = pa.Table.from_arrays(arrays, schema=columns.schema())
    out = io.BytesIO()
    pq.write_table(table, out, compression=compression)
    return out.getvalue()


def from_parquet(data: bytes) -> tuple[list[bytes], list[bytes]]:
    """The raw records of one savepoint file: its ``key_bytes`` and ``value_bytes`` columns."""
    table = pq.read_table(pa.BufferReader(data), columns=list(RAW))
    return table.column(0).to_pylist(), table.column(1).to_pylist()
