"""Merging one sketch unit's values from several partitions (a rescale that merges a sketch store
into every new partition or into one, ``core.engine.Redistribution``): the same union as the
engines' own ``merge``."""

from __future__ import annotations

import numpy as np

from localstate.engines.sketch.kll import KllSketch

__all__ = ["merge_units"]


def merge_units(kind: str, values: list[bytes]) -> bytes:
    """The union of ``values``, each one changelog value of the same unit: an HLL register (the
    largest), a Bloom word (or'ed), a quantile sketch (merged), or the layout record (identical in
    every partition of one store; the first is kept)."""
    if len(values) == 1:
        return values[0]
    if kind == "hll" and all(len(v) == 1 for v in values):
        return bytes([max(v[0] for v in values)])
    if kind == "bloom" and all(len(v) == 8 for v in values):
        words = np.frombuffer(b"".join(values), dtype="<u8")
        return np.bitwise_or.reduce(words).astype("<u8").tobytes()
    if kind == "quantiles" and not values[0].startswith(b"{"):
        merged = KllSketch.from_bytes(values[0])
        for value in values[1:]:
            merged.merge(KllSketch.from_bytes(value))
        return merged.to_bytes()
    return values[0]  # the layout record
