"""Bloom filter over a numpy ``uint64`` word array.

Sizing (optimal for ``capacity`` n and false-positive rate p): ``bits = ceil(-n ln p / ln(2)^2)``
rounded up to a multiple of 64, ``hashes = max(1, round(bits / n * ln 2))``. Bit positions use
double hashing ``(h1 + i * h2) mod bits`` with two 64-bit hashes per item (Kirsch-Mitzenmacher),
taken from one SHA-1 digest (``hash = "datasketch"``) or from the vectorised fast hash.
Bit ``b`` lives in word ``b >> 6`` at bit ``b & 63``.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from localstate.engines.sketch.hashing import encode_item, encode_items, fast_hash64, fast_hash64_many, \
    sha1_hash128_many, _fmix64, _fmix64_int

__all__ = ["BloomFilter", "bloom_size", "MAX_WORDS"]

MAX_WORDS = 1 << 32  # word indexes are u32 in changelog keys
_CHUNK = 32768
_H2 = 0xA0761D6478BD642F


def bloom_size(capacity: int, error_rate: float) -> tuple[int, int]:
    """Optimal ``(bits, hashes)`` for ``capacity`` items at ``error_rate``; bits is a multiple of 64."""
    bits = math.ceil(-capacity * math.log(error_rate) / (math.log(2) ** 2))
    bits = max(64, (bits + 63) // 64 * 64)
    hashes = max(1, round(bits / capacity * math.log(2)))
    return bits, hashes


def _as_list(items: Any) -> Any:
    if isinstance(items, np.ndarray):
        return items.ravel()
    return items if isinstance(items, (list, tuple)) else list(items)


class BloomFilter:
    """In-memory Bloom filter state: ``bits``, ``hashes`` and ``words`` (uint64)."""

    __slots__ = ("bits", "hashes", "hash", "words", "_steps")

    def __init__(self, bits: int, hashes: int, hash: str = "fast", words: np.ndarray | None = None) -> None:
        if bits % 64 or bits <= 0:
            raise ValueError(f"bits must be a positive multiple of 64, got {bits}")
        self.bits = bits
        self.hashes = hashes
        self.hash = hash
        self.words = np.zeros(bits // 64, dtype=np.uint64) if words is None else words
        self._steps = np.arange(hashes, dtype=np.uint64).reshape(-1, 1)

    # -- hashing -----------------------------------------------------------------------------
    def _pair(self, item: Any) -> tuple[int, int]:
        data = encode_item(item)
        if self.hash == "datasketch":
            digest = hashlib.sha1(data).digest()
            return int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:16], "little")
        h1 = fast_hash64(data)
        return h1, _fmix64_int(h1 ^ _H2)

    def _pairs(self, items: Any) -> tuple[np.ndarray, np.ndarray]:
        if self.hash == "datasketch":
            return sha1_hash128_many(encode_items(items))
        h1 = fast_hash64_many(items)
        return h1, _fmix64(h1 ^ np.uint64(_H2))

    def positions(self, item: Any) -> list[int]:
        """The item's bit positions: ``(h1 mod bits + i * step) mod bits``, ``step = 1 + h2 mod (bits-1)``."""
        h1, h2 = self._pair(item)
        start, step = h1 % self.bits, 1 + h2 % (self.bits - 1)
        return [(start + i * step) % self.bits for i in range(self.hashes)]

    def _positions_many(self, items: Any) -> np.ndarray:
        """Bit positions, shape (hashes, n)."""
        h1, h2 = self._pairs(items)
        bits = np.uint64(self.bits)
        start = h1 % bits
        step = h2 % np.uint64(self.bits - 1) + np.uint64(1)
        # start, step < bits < 2**38, so start + i * step cannot wrap for i < hashes.
        return (start[np.newaxis, :] + self._steps * step[np.newaxis, :]) % bits

    # -- updates and queries -----------------------------------------------------------------
    def add(self, item: Any) -> bool:
        """Add one item; return True when a bit changed."""
        changed = False
        words = self.words
        for position in self.positions(item):
            word, bit = position >> 6, np.uint64(1 << (position & 63))
            if not words[word] & bit:
                words[word] |= bit
                changed = True
        return changed

    def add_many(self, items: Any) -> None:
        items = _as_list(items)
        # Chunks keep the (hashes x chunk) temporaries in cache; fresh huge arrays cost page faults.
        for start in range(0, len(items), _CHUNK):
            positions = self._positions_many(items[start:start + _CHUNK]).ravel()
            index = (positions >> np.uint64(6)).astype(np.intp)
            bits = np.left_shift(np.uint64(1), positions & np.uint64(63))
            np.bitwise_or.at(self.words, index, bits)

    def contains(self, item: Any) -> bool:
        words = self.words
        for position in self.positions(item):
            if not int(words[position >> 6]) >> (position & 63) & 1:
                return False
        return True

    def contains_many(self, items: Any) -> np.ndarray:
        """Membership of every item (bool array; no false negatives)."""
        items = _as_list(items)
        out = np.empty(len(items), dtype=bool)
        for start in range(0, len(items), _CHUNK):
            positions = self._positions_many(items[start:start + _CHUNK])
            words = self.words[(positions >> np.uint64(6)).astype(np.intp)]
            present = (words >> (positions & np.uint64(63))) & np.uint64(1)
            out[start:start + positions.shape[1]] = present.astype(bool).all(axis=0)
        return out

    def merge(self, other_words: np.ndarray) -> None:
        np.bitwise_or(self.words, other_words, out=self.words)

    def bits_set(self) -> int:
        return int(np.unpackbits(self.words.view(np.uint8)).sum())

    def estimated_count(self) -> float:
        """Items added, estimated from the fill ratio (Swamidass & Baldi)."""
        ones = self.bits_set()
        if ones >= self.bits:
            return math.inf
        return -self.bits / self.hashes * math.log(1.0 - ones / self.bits)
