"""Item encoding and hashing shared by the sketches.

Items are encoded to bytes before hashing (the *canonical encoding*):

* ``str``  -> UTF-8 bytes
* ``bytes`` / ``bytearray`` / ``memoryview`` -> the bytes themselves
* ``int`` (and numpy integers) -> 8 bytes, little-endian two's complement (signed 64-bit range)

Anything else (float, bool, None, ...) is refused with :class:`InvalidValueError`: a float would
hash differently from the int it looks like, which silently breaks counts.

Two hash families:

* ``"datasketch"``: SHA-1 of the encoded bytes, exactly what ``datasketch`` does by default
  (``sha1_hash32`` = the first 4 digest bytes little-endian). HLL registers are then identical to
  ``datasketch.HyperLogLog(p).update(encoded)``. Costs one hashlib call per item.
* ``"fast"``: a 64-bit hash computed with numpy over whole batches (8-byte words of the encoded
  bytes folded through the murmur3 ``fmix64`` finaliser, seeded with the length). It is not
  cryptographic; it is deterministic across processes and platforms. :func:`fast_hash32` is its
  scalar 32-bit form, usable as ``datasketch.HyperLogLog(hashfunc=fast_hash32)``.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any, Iterable, Sequence

import numpy as np

from localstate.errors import InvalidValueError

__all__ = [
    "HASHES",
    "encode_item",
    "encode_items",
    "fast_hash64",
    "fast_hash32",
    "fast_hash64_many",
    "sha1_hash32_many",
    "sha1_hash128_many",
    "splitmix64",
]

HASHES = ("datasketch", "fast")

_M64 = (1 << 64) - 1
_C1 = 0xFF51AFD7ED558CCD
_C2 = 0xC4CEB9FE1A85EC53
_GOLD = 0x9E3779B97F4A7C15
_SEED = 0x6C6F63616C737461  # "localsta"
_FINAL = 0x2545F4914F6CDD1D
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1

# Batches are hashed in chunks so a few very long items do not blow up the padded matrix.
_CHUNK = 65536


def encode_item(item: Any) -> bytes:
    """Canonical bytes of one item (see module docstring)."""
    kind = type(item)
    if kind is bytes:
        return item
    if kind is str:
        try:
            return item.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidValueError(f"item {item!r:.80} cannot be encoded as UTF-8: {exc}",
                                    hint="remove unpaired surrogates from the text") from exc
    if kind is int or (isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_))):
        value = int(item)
        if not _I64_MIN <= value <= _I64_MAX:
            raise InvalidValueError(f"integer item {value} is outside the signed 64-bit range",
                                    hint="pass large integers as str(value) or bytes")
        return value.to_bytes(8, "little", signed=True)
    if isinstance(item, (bytearray, memoryview)):
        return bytes(item)
    if isinstance(item, str):  # str subclasses
        return encode_item(str(item))
    raise InvalidValueError(f"sketch items must be str, bytes or int; got {type(item).__name__} {item!r:.80}",
                            hint="convert the item to str (e.g. str(x)) or bytes before adding it")


def _int_array(items: Any) -> np.ndarray | None:
    """Return items as an int64 array when they are (all) integers, else None."""
    if isinstance(items, np.ndarray):
        if items.dtype.kind in "iu":
            if items.dtype.kind == "u" and items.size and int(items.max()) > _I64_MAX:
                raise InvalidValueError("unsigned integer items above 2**63-1 are outside the signed 64-bit range",
                                        hint="pass large integers as str(value) or bytes")
            return items.astype(np.int64, copy=False).ravel()
        return None
    if isinstance(items, Sequence) and len(items) and type(items[0]) is int:
        try:
            array = np.array(items)
        except (OverflowError, ValueError):
            return None
        if array.dtype == np.int64 and array.ndim == 1:
            return array
    return None


def encode_items(items: Iterable[Any]) -> list[bytes]:
    """Canonical bytes of many items."""
    if isinstance(items, np.ndarray):
        ints = _int_array(items)
        if ints is not None:
            raw = ints.astype("<i8").tobytes()
            return [raw[i:i + 8] for i in range(0, len(raw), 8)]
        items = items.tolist()
    out: list[bytes] = []
    append = out.append
    for item in items:
        kind = type(item)
        if kind is str:
            try:
                append(item.encode("utf-8"))
            except UnicodeEncodeError:
                append(encode_item(item))  # raises with context
        elif kind is bytes:
            append(item)
        else:
            append(encode_item(item))
    return out


def sha1_hash32_many(encoded: Sequence[bytes]) -> np.ndarray:
    """datasketch's ``sha1_hash32`` of every item, as uint32."""
    sha1 = hashlib.sha1
    raw = b"".join([sha1(b).digest()[:4] for b in encoded])
    return np.frombuffer(raw, dtype="<u4").astype(np.uint32)


def sha1_hash128_many(encoded: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Two 64-bit hashes per item from one SHA-1 digest (bytes 0-7 and 8-15, little-endian)."""
    sha1 = hashlib.sha1
    raw = b"".join([sha1(b).digest()[:16] for b in encoded])
    words = np.frombuffer(raw, dtype="<u8").astype(np.uint64).reshape(-1, 2)
    return words[:, 0].copy(), words[:, 1].copy()


def _fmix64(h: np.ndarray) -> np.ndarray:
    """murmur3's 64-bit finaliser, in place on a uint64 array (wrapping arithmetic)."""
    h ^= h >> np.uint64(33)
    h *= np.uint64(_C1)
    h ^= h >> np.uint64(33)
    h *= np.uint64(_C2)
    h ^= h >> np.uint64(33)
    return h


def _fmix64_int(h: int) -> int:
    h ^= h >> 33
    h = (h * _C1) & _M64
    h ^= h >> 33
    h = (h * _C2) & _M64
    h ^= h >> 33
    return h


def _init_int(length: int) -> int:
    return _fmix64_int(_SEED ^ ((length * _GOLD) & _M64))


_INIT8 = _init_int(8)


def fast_hash64(data: bytes) -> int:
    """Scalar form of the ``"fast"`` hash of already-encoded bytes."""
    length = len(data)
    h = _init_int(length)
    padded = data + b"\0" * (-length % 8)
    for (word,) in struct.iter_unpack("<Q", padded):
        h = _fmix64_int(h ^ word)
    return _fmix64_int(h ^ _FINAL)


def fast_hash32(data: bytes) -> int:
    """The low 32 bits of :func:`fast_hash64`: the HLL hash of ``hash = "fast"`` stores.

    Pass it as ``datasketch.HyperLogLog(p, hashfunc=fast_hash32)`` to keep updating an exported sketch.
    """
    return fast_hash64(data) & 0xFFFFFFFF


def _fast_ints(values: np.ndarray) -> np.ndarray:
    # An int is hashed as its 8 canonical bytes: one word, length 8.
    h = values.astype("<i8", copy=False).view(np.uint64) ^ np.uint64(_INIT8)
    _fmix64(h)
    h ^= np.uint64(_FINAL)
    return _fmix64(h)


def _fast_bytes(encoded: Sequence[bytes]) -> np.ndarray:
    n = len(encoded)
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=n)
    width = int(lengths.max()) if n else 0
    width = max(8, (width + 7) // 8 * 8)
    # numpy's fixed-width bytes dtype pads with NULs; the length seed keeps b"a" != b"a\0".
    matrix = np.array(encoded, dtype=f"S{width}").view("<u8").reshape(n, width // 8)
    h = (lengths.astype(np.uint64) * np.uint64(_GOLD)) ^ np.uint64(_SEED)
    _fmix64(h)
    words = (lengths + 7) // 8
    for column in range(width // 8):
        mixed = _fmix64(h ^ matrix[:, column])
        live = words > column
        if live.all():
            h = mixed
        else:
            h = np.where(live, mixed, h)
    h ^= np.uint64(_FINAL)
    return _fmix64(h)


def fast_hash64_many(items: Any) -> np.ndarray:
    """The ``"fast"`` hash of many items (any mix of str/bytes/int, or an integer numpy array)."""
    ints = _int_array(items)
    if ints is not None:
        return _fast_ints(ints)
    encoded = items if _all_bytes(items) else encode_items(items)
    if not encoded:
        return np.empty(0, dtype=np.uint64)
    parts = [_fast_bytes(encoded[i:i + _CHUNK]) for i in range(0, len(encoded), _CHUNK)]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _all_bytes(items: Any) -> bool:
    return isinstance(items, list) and all(type(x) is bytes for x in items)


def splitmix64(x: int) -> int:
    """One step of splitmix64 on a Python int (deterministic pseudo-random 64-bit value)."""
    z = (x + _GOLD) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)
