"""HyperLogLog with datasketch's register layout, rank rule and estimator.

Registers are ``numpy.int8[2**p]`` exactly as in ``datasketch.HyperLogLog``: for a 32-bit hash
``hv``, register ``hv & (m - 1)`` takes ``max(reg, 32 - p - bit_length(hv >> p) + 1)``. With
``hash = "datasketch"`` the registers equal those of ``datasketch.HyperLogLog(p)`` fed the
canonical item bytes; :meth:`HyperLogLog.count` is datasketch's estimator (linear counting below
2.5 m, large-range correction above 2**32 / 30).
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable

import numpy as np
from datasketch.hashfunc import sha1_hash32

from localstate.engines.sketch.hashing import (encode_item, encode_items, fast_hash32, fast_hash64,
                                               fast_hash64_many, sha1_hash32_many)

__all__ = ["HyperLogLog", "MIN_PRECISION", "MAX_PRECISION", "hash32_function"]

MIN_PRECISION = 4
MAX_PRECISION = 16  # datasketch.HyperLogLog accepts 4..16


def hash32_function(hash_name: str) -> Callable[[bytes], int]:
    """The scalar 32-bit hash on encoded bytes for a store's ``hash`` option (datasketch ``hashfunc``)."""
    return sha1_hash32 if hash_name == "datasketch" else fast_hash32


def _alpha(p: int) -> float:
    if p == 4:
        return 0.673
    if p == 5:
        return 0.697
    if p == 6:
        return 0.709
    return 0.7213 / (1.0 + 1.079 / (1 << p))


class HyperLogLog:
    """In-memory HLL state: ``p``, ``m = 2**p`` and ``reg`` (int8 registers)."""

    __slots__ = ("p", "m", "hash", "reg", "_max_rank", "_alpha")

    def __init__(self, p: int, hash: str = "datasketch", reg: np.ndarray | None = None) -> None:
        if not MIN_PRECISION <= p <= MAX_PRECISION:
            raise ValueError(f"precision must be in {MIN_PRECISION}..{MAX_PRECISION}, got {p}")
        self.p = p
        self.m = 1 << p
        self.hash = hash
        self.reg = np.zeros(self.m, dtype=np.int8) if reg is None else reg
        self._max_rank = 32 - p
        self._alpha = _alpha(p)

    # -- updates -----------------------------------------------------------------------------
    def hash32(self, items: Any) -> np.ndarray:
        """32-bit hashes (uint32) of many items with this sketch's hash family."""
        if self.hash == "datasketch":
            return sha1_hash32_many(encode_items(items))
        return (fast_hash64_many(items) & np.uint64(0xFFFFFFFF)).astype(np.uint32)

    def add(self, item: Any) -> bool:
        """Add one item; return True when a register changed."""
        data = encode_item(item)
        if self.hash == "datasketch":
            value = int.from_bytes(hashlib.sha1(data).digest()[:4], "little")  # == sha1_hash32(data)
        else:
            value = fast_hash64(data) & 0xFFFFFFFF
        index = value & (self.m - 1)
        rank = self._max_rank - (value >> self.p).bit_length() + 1
        if rank > self.reg[index]:
            self.reg[index] = rank
            return True
        return False

    def add_hashes(self, hv: np.ndarray) -> None:
        """Fold 32-bit hashes into the registers (vectorised)."""
        if hv.size == 0:
            return
        hv = hv.astype(np.uint32, copy=False)
        index = (hv & np.uint32(self.m - 1)).astype(np.intp)
        bits = hv >> np.uint32(self.p)
        # frexp's exponent of a positive integer is its bit length (exact below 2**53); 0 -> 0.
        _, length = np.frexp(bits.astype(np.float64))
        rank = (self._max_rank + 1 - length).astype(np.int8)
        np.maximum.at(self.reg, index, rank)

    def add_many(self, items: Any) -> None:
        self.add_hashes(self.hash32(items))

    def merge(self, other_reg: np.ndarray) -> None:
        np.maximum(self.reg, other_reg, out=self.reg)

    # -- queries -----------------------------------------------------------------------------
    def count(self) -> float:
        """datasketch's cardinality estimate (without its threshold warning)."""
        e = self._alpha * float(self.m ** 2) / float(np.sum(2.0 ** (-self.reg.astype(np.float64))))
        if e <= 2.5 * self.m:
            zeros = self.m - int(np.count_nonzero(self.reg))
            return float(self.m * np.log(self.m / float(zeros))) if zeros else e
        if e <= (1.0 / 30.0) * (1 << 32):
            return e
        return float(-(1 << 32) * np.log(1.0 - e / (1 << 32)))

    def standard_error(self) -> float:
        """The relative standard error 1.04 / sqrt(m)."""
        return 1.04 / float(np.sqrt(self.m))
