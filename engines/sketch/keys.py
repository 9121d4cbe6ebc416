"""Binary keys of the sketch engine's records (in the inner key-value store and the changelog).

``key = varint(len(name)) + name + suffix`` where ``name`` is the sketch name as serialised by the
store's key serde and ``suffix`` is

* a big-endian ``u32`` unit index for HLL registers and Bloom words (4 bytes), or
* empty for a quantile sketch (the value is the whole serialised sketch).

The length prefix makes ``varint(len(name)) + name`` a prefix of exactly one sketch's keys, so a
prefix scan loads one sketch, and a compacted changelog holds at most one record per unit.
:data:`META_KEY` (``b"\\xff"``, an unterminated varint) can never be a sketch key; it holds the
store's layout (kind and parameters) so a reopened store with incompatible options is refused.
"""

from __future__ import annotations

import struct

import numpy as np

__all__ = ["META_KEY", "name_prefix", "unit_key", "unit_keys", "split_key", "unit_indexes"]

META_KEY = b"\xff"
_U32 = struct.Struct(">I")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def name_prefix(name: bytes) -> bytes:
    """The key prefix shared by every record of the sketch ``name``."""
    return _varint(len(name)) + name


def unit_key(prefix: bytes, index: int) -> bytes:
    return prefix + _U32.pack(index)


def unit_keys(prefix: bytes, indexes: np.ndarray) -> list[bytes]:
    """Keys of many units of one sketch (vectorised packing of the u32 suffixes)."""
    raw = indexes.astype(">u4").tobytes()
    return [prefix + raw[i:i + 4] for i in range(0, len(raw), 4)]


def split_key(key: bytes) -> tuple[bytes, bytes] | None:
    """``(name, suffix)`` of a sketch key, or None for the meta key or anything malformed."""
    length = 0
    shift = 0
    for position, byte in enumerate(key):
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            start = position + 1
            end = start + length
            if end > len(key):
                return None
            return key[start:end], key[end:]
        shift += 7
        if shift > 28:
            return None
    return None


def unit_indexes(keys: list[bytes]) -> np.ndarray:
    """The u32 unit index at the end of each key."""
    return np.frombuffer(b"".join([k[-4:] for k in keys]), dtype=">u4").astype(np.int64)
