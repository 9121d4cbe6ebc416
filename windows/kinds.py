"""Window kinds: which event-time windows a record belongs to.

A window is the half-open interval ``[start, end)`` of event time (float seconds, as
``Envelope.timestamp``). Tumbling and hopping windows are *aligned*: window ``i`` starts at
``offset + i * advance`` and is identified by the integer ``i``, so its bounds are computed the
same way wherever they are needed (assignment, the timer that closes it, the reference model) and
compare exactly. Session windows are not aligned: they grow and merge with the records of a key
(see :class:`Session`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from localstate.core.options import parse_duration
from localstate.errors import ConfigError

__all__ = ["Window", "WindowKind", "Tumbling", "Hopping", "Session", "duration", "MIN_WINDOW_SECONDS",
           "MAX_WINDOWS_PER_RECORD"]

MIN_WINDOW_SECONDS = 0.001
"""The shortest window size, hop (``advance``) and session gap: 1 ms. Event time is float seconds,
whose resolution near year 2200 is about a microsecond; far shorter windows would have bounds that
do not compute the same way twice, and their timers would close nothing."""

MAX_WINDOWS_PER_RECORD = 10_000
"""The most windows one record may belong to (a hopping window's ``ceil(size / advance)``): each is a
store update and a timer per record, so a hop a million times shorter than the size costs a million."""


class Window(NamedTuple):
    """One window of event time, ``[start, end)`` in seconds."""

    start: float
    end: float


def duration(where: str, value: Any, *, positive: bool = True) -> float:
    """``value`` (seconds, or a string such as ``"1h"``) as seconds; a ConfigError naming ``where``
    when it is not a duration (or, when ``positive``, shorter than :data:`MIN_WINDOW_SECONDS`)."""
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise ConfigError.at(where, str(exc), hint="give seconds, or a string such as '10s', '5m' or '1h'") from None
    if positive and seconds <= 0:
        raise ConfigError.at(where, f"must be more than zero, got {value!r}", hint="give a positive duration")
    if positive and seconds < MIN_WINDOW_SECONDS:
        raise ConfigError.at(where, f"{value!r} is shorter than the shortest window duration, "
                             f"{MIN_WINDOW_SECONDS * 1000:g} ms: windows that short cannot be told apart in float "
                             f"seconds, and would never close", hint="give '1ms' or more (event time is seconds: "
                                                                     "declare the inputs' timestamp_unit)")
    return seconds


class WindowKind:
    """Base of the window kinds (tumbling, hopping, session)."""

    aligned = True
    """Aligned kinds (tumbling, hopping) have fixed windows numbered by :meth:`index_range`."""


@dataclass(frozen=True, init=False)
class Hopping(WindowKind):
    """Windows of ``size`` seconds starting every ``advance`` seconds (``offset`` shifts them from
    the epoch): a record belongs to ``ceil(size / advance)`` windows (Flink's sliding windows, Kafka
    Streams' hopping ``TimeWindows``, Spark's ``window(ts, size, slide)``, Quix's hopping windows)."""

    size: float
    advance: float
    offset: float
    hops: int
    """``size / advance`` when it is a whole number (then window ``i`` ends where window ``i + hops``
    starts, so windows tile exactly in floating point), else 0"""

    def __init__(self, size: Any, advance: Any, offset: Any = 0.0) -> None:
        object.__setattr__(self, "size", duration("window.size", size))
        object.__setattr__(self, "advance", duration("window.advance", advance))
        object.__setattr__(self, "offset", duration("window.offset", offset, positive=False))
        if self.advance > self.size:
            raise ConfigError.at("window.advance", f"advance {advance!r} is longer than the window size {size!r}: "
                                 "records between windows would belong to none",
                                 hint="make advance at most the size (equal: tumbling windows)")
        per_record = math.ceil(self.size / self.advance - 1e-9)
        if per_record > MAX_WINDOWS_PER_RECORD:
            raise ConfigError.at("window.advance", f"advance {advance!r} puts every record in {per_record:,} "
                                 f"windows of size {size!r}; at most {MAX_WINDOWS_PER_RECORD:,} windows per record are allowed "
                                 "(each is a store update and a timer per record)",
                                 hint=f"make advance at least size / {MAX_WINDOWS_PER_RECORD:,} "
                                      f"({self.size / MAX_WINDOWS_PER_RECORD:g} s), or the size shorter")
        hops = round(self.size / self.advance)
        object.__setattr__(self, "hops", hops if math.isclose(hops * self.advance, self.size, rel_tol=1e-12) else 0)

    def window(self, index: int) -> Window:
        """Window number ``index``."""
        start = self.offset + index * self.advance
        if self.hops:
            return Window(start, self.offset + (index + self.hops) * self.advance)
        return Window(start, start + self.size)

    def indexes(self, ts: float) -> range:
        """The numbers of the windows ``ts`` belongs to, oldest first."""
        # Division rounds: move each end until the bounds, computed as window() does, hold ts.
        first = math.floor((ts - self.offset - self.size) / self.advance) + 1
        while self.window(first - 1).end > ts:
            first -= 1
        while self.window(first).end <= ts:
            first += 1
        last = math.floor((ts - self.offset) / self.advance)
        while self.window(last + 1).start <= ts:
            last += 1
        while self.window(last).start > ts:
            last -= 1
        return range(first, last + 1)

    def index_closing_at(self, timestamp: float, lateness: float) -> int | None:
        """The number of the window whose ``end + lateness`` is ``timestamp`` exactly (computed as
        the operator computes its timer), or None."""
        guess = round((timestamp - lateness - self.size - self.offset) / self.advance)
        for index in (guess, guess - 1, guess + 1, guess - 2, guess + 2):
            if self.window(index).end + lateness == timestamp:
                return index
        return None


@dataclass(frozen=True, init=False)
class Tumbling(Hopping):
    """Back-to-back windows of ``size`` seconds (``offset`` shifts them from the epoch): every
    record belongs to exactly one (Flink's and Kafka Streams' tumbling windows, Spark's
    ``window(ts, size)``, Quix's ``tumbling_window``)."""

    def __init__(self, size: Any, offset: Any = 0.0) -> None:
        super().__init__(size, size, offset)

    def indexes(self, ts: float) -> range:
        index = math.floor((ts - self.offset) / self.size)
        # Division rounds: move to the window whose bounds, computed as window() does, hold ts.
        while self.window(index).start > ts:
            index -= 1
        while not ts < self.window(index).end:
            index += 1
        return range(index, index + 1)


@dataclass(frozen=True, init=False)
class Session(WindowKind):
    """Per-key windows of activity: a record opens ``[ts, ts + gap)``, and windows of one key that
    overlap or touch merge into one (Flink's ``EventTimeSessionWindows``, Kafka Streams'
    ``SessionWindows``, Spark's ``session_window``, Quix has none)."""

    aligned = False
    gap: float

    def __init__(self, gap: Any) -> None:
        object.__setattr__(self, "gap", duration("window.gap", gap))

    def window(self, ts: float) -> Window:
        """The window a record at ``ts`` opens before merging."""
        return Window(ts, ts + self.gap)


def overlaps(a: Window | tuple[float, float], b: Window | tuple[float, float]) -> bool:
    """Whether two session windows merge: they overlap or touch (Flink's ``TimeWindow.intersects``)."""
    return a[0] <= b[1] and a[1] >= b[0]
