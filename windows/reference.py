"""The plain-Python reference model of :class:`~localstate.windows.WindowedAggregation`: the same
window rules over a list of records, with no store, timer or runtime. Tests and examples compare
the library's outputs with it.

The rules: a record is given the watermark its partition had when the record was processed; a
window is closed once ``end + lateness <= watermark``; a record whose windows are all closed is
late. Session windows overlapping or touching the record's ``[ts, ts + gap)`` merge with it, closed
ones excepted. ``emit = "final"`` sends every window closed by the last watermark once;
``"update"`` sends the window's aggregate after each record that changed it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from localstate.windows.aggregations import Aggregation
from localstate.windows.kinds import Hopping, Session, Window, WindowKind, overlaps

__all__ = ["ReferenceResult", "reference_windows", "watermarks"]


@dataclass
class ReferenceResult:
    outputs: list[tuple[Any, Window, Any]] = field(default_factory=list)
    """``(key, window, aggregate)`` in the order sent (final: by closing time, then key order)."""
    late: list[tuple[Any, Any]] = field(default_factory=list)
    """The late records' ``(key, value)``, in order."""
    open: dict[tuple[Any, Window], Any] = field(default_factory=dict)
    """Windows not closed by the last watermark -> their aggregate so far."""


def watermarks(timestamps: Iterable[float], lag: float = 0.0) -> list[float]:
    """The watermark after each record: the largest timestamp so far minus ``lag``."""
    out, top = [], float("-inf")
    for ts in timestamps:
        top = max(top, ts)
        out.append(top - lag)
    return out


def reference_windows(records: Iterable[tuple[Any, Any, float, float | None]], window: WindowKind,
                      aggregate: Aggregation, *, emit: str = "final", lateness: float = 0.0,
                      final_watermark: float | None = None) -> ReferenceResult:
    """Run the window rules over ``records``: ``(key, value, timestamp, watermark when processed)``.
    ``final_watermark`` closes the windows whose end plus ``lateness`` it reaches (default: the last
    record's watermark)."""
    result = ReferenceResult()
    update = emit == "update"
    # (key, window) -> values, in arrival order; for sessions the windows change as they merge
    state: dict[tuple[Any, Window], list[Any]] = {}
    last = None
    for key, value, ts, watermark in records:
        last = watermark if watermark is not None else last
        if isinstance(window, Session):
            opened = window.window(ts)
            merging = sorted(w for (k, w) in state if k == key and overlaps(w, opened)
                             and (watermark is None or w.end + lateness > watermark))
            if not merging and watermark is not None and opened.end + lateness <= watermark:
                result.late.append((key, value))
                continue
            merged = Window(min([opened.start, *(w.start for w in merging)]), max([opened.end, *(w.end for w in merging)]))
            values = [v for w in merging for v in state.pop((key, w))] + [value]
            state[(key, merged)] = values
            if update:
                result.outputs.append((key, merged, aggregate.reference(values)))
            continue
        assert isinstance(window, Hopping)
        taken = False
        for index in window.indexes(ts):
            w = window.window(index)
            if watermark is not None and w.end + lateness <= watermark:
                continue
            taken = True
            values = state.setdefault((key, w), [])
            values.append(value)
            if update:
                result.outputs.append((key, w, aggregate.reference(values)))
        if not taken:
            result.late.append((key, value))
    end = final_watermark if final_watermark is not None else last
    closing = sorted(((w.end + lateness, repr(k), k, w) for (k, w) in state), key=lambda e: e[:2])
    for closes, _, key, w in closing:
        aggregate_value = aggregate.reference(state[(key, w)])
        if end is not None and closes <= end:
            if not update:
                result.outputs.append((key, w, aggregate_value))
        else:
            result.open[(key, w)] = aggregate_value
    return result
