"""Kafka-compatible partitioning: ``murmur2(key bytes) & 0x7fffffff % partitions``, exactly as the
Java client's default partitioner, so stores, changelogs and Kafka topics stay co-partitioned."""

from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np

from localstate.native import load as load_native

__all__ = ["murmur2", "py_murmur2", "partition_for", "key_bytes", "partitions_of", "partitions_of_bytes"]


def py_murmur2(data: bytes) -> int:
    """Kafka's murmur2 (seed 0x9747b28c), returned as a signed 32-bit int like Java's (the reference of
    the C version :func:`murmur2` is when it is built)."""
    length = len(data)
    m, r = 0x5BD1E995, 24
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    tail = length & ~3
    for i in range(0, tail, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    extra = length & 3
    if extra >= 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


_NATIVE = load_native("localstate.native._hotpath")
murmur2 = py_murmur2 if _NATIVE is None else _NATIVE.murmur2
"""Kafka's murmur2 of ``data`` (bytes): :func:`py_murmur2`, in C when built."""


def key_bytes(key: Any) -> bytes:
    """The bytes a key is partitioned by: bytes as is, str as UTF-8, int as its decimal text
    (what Kafka's StringSerializer would send), anything else as compact sorted JSON."""
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key).encode("ascii")
    return json.dumps(key, separators=(",", ":"), sort_keys=True).encode("utf-8")


def partition_for(key: Any, partitions: int) -> int:
    """The partition of ``key`` among ``partitions`` (Kafka's default for keyed records)."""
    return (murmur2(key_bytes(key)) & 0x7FFFFFFF) % partitions


_KNOWN: dict[tuple[int, Any], int] = {}
"""``(partitions, key) -> partition`` in this process: a key's partition never changes, and murmur2 in
Python costs microseconds a key (kept bounded by :data:`_KNOWN_LIMIT`)."""
_KNOWN_LIMIT = 2_000_000


def partitions_of(keys: Any, partitions: int) -> Any:
    """:func:`partition_for` of each of ``keys``, computed once per distinct key of the batch and
    remembered across calls: a list for a list of keys, an int32 pyarrow array for a pyarrow array of
    keys (strings or integers, no nulls)."""
    known = _KNOWN
    if len(known) > _KNOWN_LIMIT:
        known.clear()
    if not isinstance(keys, list):  # a pyarrow array: its distinct keys, then their partitions taken per row
        # CLI start-up: --help loads this module, not pyarrow (only key columns need it)
        import pyarrow as pa
        import pyarrow.compute as pc

        encoded = pc.dictionary_encode(keys)
        distinct = partitions_of(encoded.dictionary.to_pylist(), partitions)
        return pa.array(distinct, pa.int32()).take(encoded.indices)
    out = []
    append = out.append
    for key in keys:
        try:
            part = known.get((partitions, key))
        except TypeError:  # an unhashable key (a JSON list or object): computed each time
            append(partition_for(key, partitions))
            continue
        if part is None:
            part = known[(partitions, key)] = partition_for(key, partitions)
        append(part)
    return out


_M = np.uint32(0x5BD1E995)


def _murmur2_rows(rows: np.ndarray) -> np.ndarray:
    """:func:`murmur2` of each row of ``rows`` (an ``(n, length)`` uint8 array of keys of one
    length), unsigned, vectorised over the rows (uint32 arithmetic wraps as Java's does)."""
    count, length = rows.shape
    h = np.full(count, (0x9747B28C ^ length) & 0xFFFFFFFF, dtype=np.uint32)
    tail = length & ~3
    if tail:
        words = rows[:, :tail].copy().view("<u4")
        for i in range(words.shape[1]):
            k = words[:, i] * _M
            k ^= k >> np.uint32(24)
            k *= _M
            h *= _M
            h ^= k
    extra = length & 3
    if extra >= 3:
        h ^= rows[:, tail + 2].astype(np.uint32) << np.uint32(16)
    if extra >= 2:
        h ^= rows[:, tail + 1].astype(np.uint32) << np.uint32(8)
    if extra >= 1:
        h ^= rows[:, tail].astype(np.uint32)
        h *= _M
    h ^= h >> np.uint32(13)
    h *= _M
    h ^= h >> np.uint32(15)
    return h


def partitions_of_bytes(keys: Sequence[bytes], partitions: int) -> np.ndarray:
    """``partition_for`` of many keys already in their partitioning bytes (:func:`key_bytes`), as an
    int64 array: murmur2 vectorised over the keys of each length (a rescale routes millions)."""
    out = np.empty(len(keys), dtype=np.int64)
    if not len(keys):
        return out
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    for length in np.unique(lengths).tolist():
        where = np.flatnonzero(lengths == length)
        chosen = keys if len(where) == len(keys) else [keys[i] for i in where.tolist()]
        rows = np.frombuffer(b"".join(chosen), dtype=np.uint8).reshape(len(chosen), length)
        out[where] = ((_murmur2_rows(rows) & np.uint32(0x7FFFFFFF)) % np.uint32(partitions)).astype(np.int64)
    return out
