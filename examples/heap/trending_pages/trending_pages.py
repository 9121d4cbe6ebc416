"""Trending pages: the ``TOP`` most viewed pages of every one-minute event-time window.

Every view pushes ``page -> views so far in the open window`` into a running top-N heap store
(``engine = "heap"``); the current leaders are always one ``top()`` call away. When the partition's
event time enters a new window, the closed window's top pages are emitted and the heap is cleared.
A commit logs one changelog record per page whose count changed, not one per view.

The input is keyed (and so partitioned) by page: each page is counted in exactly one partition, so
the global top N of a window is the top N of the union of the partitions' lists (see
:func:`merge_partitions`).
"""

from __future__ import annotations

from typing import Any, Iterable

from localstate.core.task import Collector, Coordinator, Envelope, StreamTask, TaskContext

__all__ = ["TrendingPages", "merge_partitions", "WINDOW", "TOP"]

WINDOW = 60  # seconds of event time
TOP = 5


class TrendingPages(StreamTask):
    def init(self, context: TaskContext) -> None:
        self.views = context.store("views")   # heap: page -> views in the open window
        self.clock = context.store("clock")   # kv: "window" -> start of the open window

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        window = int(envelope.timestamp // WINDOW) * WINDOW
        open_window = self.clock.get("window")
        if open_window is not None and window < open_window:
            return  # late: its window was already emitted
        if open_window is not None and window > open_window:
            self.close_window(open_window, collector)
        if window != open_window:
            self.clock.put("window", window)
        page = envelope.key
        self.views.push(page, (self.views.score(page) or 0) + 1)

    def close_window(self, window: int, collector: Collector) -> None:
        """Emit the window's leaders, then forget its counts (one tombstone per page at the commit)."""
        top = [[entry.item, int(entry.score)] for entry in self.views.top(TOP)]
        collector.send("trending", window, {"window": window, "pages": len(self.views), "top": top})
        self.views.clear()


def merge_partitions(rows: Iterable[dict[str, Any]], n: int = TOP) -> dict[int, list[list[Any]]]:
    """The global top ``n`` per window from the per-partition output values (exact because every
    page lives in one partition). Ties rank like the heap store: by page, ascending."""
    merged: dict[int, list[list[Any]]] = {}
    for row in rows:
        merged.setdefault(row["window"], []).extend(row["top"])
    return {window: sorted(top, key=lambda pv: (-pv[1], pv[0].encode()))[:n]
            for window, top in sorted(merged.items())}
