"""A time source that tests move by hand, for timers and TTL (:mod:`localstate.core.time`)."""

from __future__ import annotations

__all__ = ["ManualTime"]


class ManualTime:
    """A :class:`~localstate.core.time.TimeSource` whose processing time and watermark only move
    when a test moves them. The watermark never goes back, as a runtime's does not."""

    def __init__(self, processing_time: float = 0.0, watermark: float | None = None) -> None:
        self._processing = float(processing_time)
        self._watermark = watermark

    def processing_time(self) -> float:
        return self._processing

    @property
    def watermark(self) -> float | None:
        return self._watermark

    def advance_processing_time(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward (negative: a ValueError; the clock does not go back here)."""
        if seconds < 0:
            raise ValueError(f"processing time moves forward only, got {seconds!r} seconds")
        self._processing += seconds

    def advance_watermark(self, to: float) -> None:
        """Move the watermark to ``to`` (ignored when it is not ahead, as a runtime's watermark)."""
        if self._watermark is None or to > self._watermark:
            self._watermark = float(to)
