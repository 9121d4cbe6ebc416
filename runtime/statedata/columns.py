"""The columns of a savepoint's Parquet files.

Every store's files have ``key_bytes`` and ``value_bytes`` (binary): the changelog's records exactly,
the engine-neutral form every kind restores from (a ttl store's values keep their expiry stamp; heaps,
sketches and search indexes their own record formats). Beside them, decoded columns where the
store's serdes allow, typed as the state reader types them (``int`` -> int64, ``string`` -> string,
``bytes`` -> binary, any other serde -> JSON text): ``key`` for a kv, heap or search store (the key,
item or document id), ``value`` for a kv store, and ``expiry`` (seconds since the epoch; null: never)
for a kv store with ``ttl``. The other engines' typed columns (a sketch's estimate, a heap's score)
are what ``spark.read.format("localstate").option("savepoint", PATH)`` shows.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from localstate.core.config import JobConfig, StoreConfig
from localstate.runtime.driver.views import serde_column, store_serdes, value_splitter

__all__ = ["StoreColumns", "store_columns", "to_parquet", "from_parquet", "RAW"]

RAW = ("key_bytes", "value_bytes")
_ARROW = {"bigint": pa.int64(), "string": pa.string(), "binary": pa.binary()}


@dataclass(frozen=True)
class StoreColumns:
    """The decoded columns of one store: ``(name, arrow type, decode)`` each, ``decode`` taking a
    record's ``(key, value)`` bytes."""

    decoded: tuple[tuple[str, pa.DataType, Callable[[bytes, bytes], Any]], ...]

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
    if config.engine == "kv":
        value = serde_column(value_serde, config.value_serde, config.name)
        split = value_splitter(job, config)
        if split is None:
            decoded.append(("value", _ARROW[value.type], lambda k, v, decode=value.decode: decode(v)))
        else:
            decoded.append(("value", _ARROW[value.type], lambda k, v, decode=value.decode: decode(split(v)[0])))
            decoded.append(("expiry", pa.float64(), lambda k, v: _finite(split(v)[1])))
    return StoreColumns(tuple(decoded))


def _finite(expiry: float | None) -> float | None:
    return None if expiry is None or math.isinf(expiry) else expiry


def to_parquet(keys: list[bytes], values: list[bytes], columns: StoreColumns) -> bytes:
    """One Parquet file of records (keys in byte order) with their decoded columns."""
    arrays = [pa.array(keys, pa.binary()), pa.array(values, pa.binary())]
    for _name, kind, decode in columns.decoded:
        arrays.append(pa.array([decode(k, v) for k, v in zip(keys, values)], kind))
    table = pa.Table.from_arrays(arrays, schema=columns.schema())
    out = io.BytesIO()
    pq.write_table(table, out, compression="zstd")
    return out.getvalue()


def from_parquet(data: bytes) -> tuple[list[bytes], list[bytes]]:
    """The raw records of one savepoint file: its ``key_bytes`` and ``value_bytes`` columns."""
    table = pq.read_table(pa.BufferReader(data), columns=list(RAW))
    return table.column(0).to_pylist(), table.column(1).to_pylist()
