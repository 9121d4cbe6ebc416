"""KLL quantile sketch (Karnin, Lang, Liberty 2016), laid out like Apache DataSketches' KLL.

Levels ``0..H-1`` hold items of weight ``2**h``. Level ``h`` has capacity
``max(8, round(k * (2/3) ** (H - h - 1)))``. When the retained items reach the total capacity,
the lowest level at or over its capacity is *compacted*: sorted, one item left behind if the count
is odd, and every other item (offset 0 or 1 by a coin flip) promoted to level ``h+1``.

Published error (DataSketches' empirical fit, 99% confidence, maximum over all ranks):
normalised rank error ``eps(k) = 2.296 / k ** 0.9723`` (k = 200 -> 1.33%); see :func:`rank_error`.

Determinism: the coin of the ``c``-th compaction is ``splitmix64(seed + c) >> 63`` where ``seed`` is
derived from the sketch name, and ``c`` is part of the serialised state. So the same inputs give
the same bytes, and a restored sketch continues exactly as the original would have.
``add_many`` is equivalent to calling ``add`` per value (same compaction points).
Values are float64; NaN values are ignored (as DataSketches does).
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from localstate.engines.sketch.hashing import splitmix64

__all__ = ["KllSketch", "rank_error", "MIN_K", "MAX_K"]

MIN_K = 8
MAX_K = 65535
_MIN_WIDTH = 8
_MAGIC = b"KL"
_VERSION = 1
_HEADER = struct.Struct("<2sBHBQQQdd")  # magic, version, k, levels, n, seed, compactions, min, max


def rank_error(k: int) -> float:
    """DataSketches' normalised rank error bound for KLL (99% confidence, all ranks)."""
    return 2.296 / k ** 0.9723


def _capacity(k: int, levels: int, height: int) -> int:
    depth = levels - height - 1
    return max(_MIN_WIDTH, int(k * (2.0 / 3.0) ** depth + 0.5))


class KllSketch:
    """A KLL sketch of float64 values. Not thread safe."""

    __slots__ = ("k", "seed", "n", "compactions", "min", "max", "_levels", "_buf", "_n0", "_caps",
                 "_total_cap", "_retained_upper", "_view")

    def __init__(self, k: int = 200, seed: int = 0) -> None:
        if not MIN_K <= k <= MAX_K:
            raise ValueError(f"k must be in {MIN_K}..{MAX_K}, got {k}")
        self.k = k
        self.seed = seed & ((1 << 64) - 1)
        self.n = 0
        self.compactions = 0
        self.min = math.inf
        self.max = -math.inf
        # Level 0 lives in a growable buffer (insertion order); levels >= 1 are sorted arrays.
        self._buf = np.empty(2 * k + _MIN_WIDTH, dtype=np.float64)
        self._n0 = 0
        self._levels: list[np.ndarray] = [np.empty(0)]  # index 0 unused placeholder
        self._set_levels(1)
        self._retained_upper = 0
        self._view: tuple[np.ndarray, np.ndarray] | None = None

    # -- structure ---------------------------------------------------------------------------
    def _set_levels(self, count: int) -> None:
        while len(self._levels) < count:
            self._levels.append(np.empty(0))
        self._caps = [_capacity(self.k, count, h) for h in range(count)]
        self._total_cap = sum(self._caps)
        if self._buf.size < self._total_cap:
            grown = np.empty(self._total_cap, dtype=np.float64)
            grown[: self._n0] = self._buf[: self._n0]
            self._buf = grown

    @property
    def num_levels(self) -> int:
        return len(self._levels)

    @property
    def retained(self) -> int:
        return self._n0 + self._retained_upper

    def level(self, height: int) -> np.ndarray:
        """A copy of one level's items (level 0 in insertion order, others sorted)."""
        return self._buf[: self._n0].copy() if height == 0 else self._levels[height].copy()

    def _coin(self) -> int:
        bit = splitmix64((self.seed + self.compactions) & ((1 << 64) - 1)) >> 63
        self.compactions += 1
        return bit

    def _compress(self) -> None:
        """One compaction of the lowest level at or over its capacity."""
        height = 0
        while True:
            size = self._n0 if height == 0 else self._levels[height].size
            if size >= self._caps[height]:
                break
            height += 1
        if height == self.num_levels - 1:
            self._set_levels(self.num_levels + 1)
        if height == 0:
            items = np.sort(self._buf[: self._n0])
        else:
            items = self._levels[height]  # already sorted
        if items.size % 2:
            keep, items = items[:1], items[1:]
        else:
            keep = items[:0]
        promoted = items[self._coin()::2]
        upper = self._levels[height + 1]
        merged = np.concatenate([upper, promoted])
        merged.sort(kind="stable")
        self._levels[height + 1] = merged
        if height == 0:
            self._buf[: keep.size] = keep
            self._n0 = keep.size
            self._retained_upper += promoted.size
        else:
            self._levels[height] = keep.copy()
            self._retained_upper += promoted.size - items.size
        self._view = None

    # -- updates -----------------------------------------------------------------------------
    def add(self, value: float) -> None:
        value = float(value)
        if value != value:  # NaN
            return
        self._buf[self._n0] = value
        self._n0 += 1
        self.n += 1
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value
        self._view = None
        if self.retained >= self._total_cap:
            self._compress()

    def add_many(self, values: Any) -> None:
        array = np.asarray(values, dtype=np.float64).ravel()
        array = array[~np.isnan(array)]
        if array.size == 0:
            return
        self.min = min(self.min, float(array.min()))
        self.max = max(self.max, float(array.max()))
        self._view = None
        start = 0
        while start < array.size:
            take = min(self._total_cap - self.retained, array.size - start)
            self._buf[self._n0:self._n0 + take] = array[start:start + take]
            self._n0 += take
            self.n += take
            start += take
            if self.retained >= self._total_cap:
                self._compress()

    def merge(self, other: "KllSketch") -> None:
        """Fold ``other`` into this sketch (weights preserved; then compact down to capacity)."""
        if other.n == 0:
            return
        if other.num_levels > self.num_levels:
            self._set_levels(other.num_levels)
        level0 = np.concatenate([self._buf[: self._n0], other._buf[: other._n0]])
        for height in range(1, other.num_levels):
            if other._levels[height].size:
                merged = np.concatenate([self._levels[height], other._levels[height]])
                merged.sort(kind="stable")
                self._retained_upper += other._levels[height].size
                self._levels[height] = merged
        if level0.size > self._buf.size:
            self._buf = np.empty(level0.size + self._total_cap, dtype=np.float64)
        self._buf[: level0.size] = level0
        self._n0 = level0.size
        self.n += other.n
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        self._view = None
        while self.retained >= self._total_cap:
            self._compress()

    # -- queries -----------------------------------------------------------------------------
    def _sorted_view(self) -> tuple[np.ndarray, np.ndarray]:
        if self._view is None:
            parts = [self._buf[: self._n0]] + self._levels[1:]
            values = np.concatenate(parts)
            weights = np.concatenate([np.full(part.size, 1 << h, dtype=np.int64) for h, part in enumerate(parts)])
            order = np.argsort(values, kind="stable")
            self._view = (values[order], np.cumsum(weights[order]))
        return self._view

    def quantile(self, q: float) -> float:
        """Smallest retained value whose inclusive normalised rank is >= q; NaN when empty."""
        return float(self.quantiles([q])[0])

    def quantiles(self, qs: Any) -> np.ndarray:
        qs = np.asarray(qs, dtype=np.float64)
        if np.any((qs < 0) | (qs > 1)) or np.any(np.isnan(qs)):
            raise ValueError("quantile fractions must be in [0, 1]")
        if self.n == 0:
            return np.full(qs.shape, np.nan)
        values, cumulative = self._sorted_view()
        index = np.searchsorted(cumulative, qs * self.n, side="left")
        out = values[np.minimum(index, values.size - 1)]
        out = np.where(qs <= 0.0, self.min, out)
        return np.where(qs >= 1.0, self.max, out)

    def rank(self, value: float) -> float:
        """Estimated fraction of values <= ``value`` (inclusive rank); NaN when empty."""
        return float(self.cdf([value])[0])

    def cdf(self, points: Any) -> np.ndarray:
        """Estimated inclusive rank of each point."""
        points = np.asarray(points, dtype=np.float64)
        if self.n == 0:
            return np.full(points.shape, np.nan)
        values, cumulative = self._sorted_view()
        index = np.searchsorted(values, points, side="right")
        weight = np.where(index > 0, cumulative[np.maximum(index - 1, 0)], 0)
        return weight / self.n

    # -- serialisation -----------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """Exact state: header, level sizes (u32), then every level's items (f64, little-endian)."""
        levels = self.num_levels
        header = _HEADER.pack(_MAGIC, _VERSION, self.k, levels, self.n, self.seed, self.compactions,
                              self.min, self.max)
        sizes = [self._n0] + [self._levels[h].size for h in range(1, levels)]
        body = [self._buf[: self._n0].astype("<f8").tobytes()]
        body += [self._levels[h].astype("<f8").tobytes() for h in range(1, levels)]
        return header + struct.pack(f"<{levels}I", *sizes) + b"".join(body)

    @classmethod
    def from_bytes(cls, data: bytes) -> "KllSketch":
        try:
            magic, version, k, levels, n, seed, compactions, low, high = _HEADER.unpack_from(data, 0)
            if magic != _MAGIC or version != _VERSION:
                raise ValueError(f"not a KLL sketch (magic {magic!r}, version {version})")
            offset = _HEADER.size
            sizes = struct.unpack_from(f"<{levels}I", data, offset)
            offset += 4 * levels
            sketch = cls(k, seed)
            sketch._set_levels(levels)
            sketch.n, sketch.compactions, sketch.min, sketch.max = n, compactions, low, high
            for height, size in enumerate(sizes):
                items = np.frombuffer(data, dtype="<f8", count=size, offset=offset).astype(np.float64)
                offset += 8 * size
                if height == 0:
                    if sketch._buf.size < size:
                        sketch._buf = np.empty(size + sketch._total_cap, dtype=np.float64)
                    sketch._buf[:size] = items
                    sketch._n0 = size
                else:
                    sketch._levels[height] = items
            sketch._retained_upper = sum(sizes[1:])
            if offset != len(data):
                raise ValueError(f"{len(data) - offset} trailing bytes")
        except (struct.error, ValueError) as exc:
            raise ValueError(f"corrupt KLL sketch ({len(data)} bytes): {exc}") from exc
        return sketch

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KllSketch) and self.to_bytes() == other.to_bytes()

    __hash__ = None  # type: ignore[assignment]
