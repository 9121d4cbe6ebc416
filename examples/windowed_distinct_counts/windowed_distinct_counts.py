"""Windowed distinct counts: how many different users viewed each page in every event-time hour,
estimated with one HyperLogLog per (page, hour) and emitted once, when the hour closes.

The window library keeps the sketches in the ``visitors`` sketch store (``kind = "hll"``), keyed by
page here (the window's key is the page, not the record's key), and deletes each when its hour is
emitted. The input is partitioned by user, so the partitions see disjoint users: a page's global
count for an hour is the sum of the partitions' counts (:func:`merge_partitions`)."""

from __future__ import annotations

from typing import Any, Iterable

from localstate.core.task import Collector, Coordinator, Envelope, StreamTask, TaskContext
from localstate.windows import Tumbling, Window, WindowedAggregation, distinct_count

__all__ = ["PageVisitorsPerHour", "merge_partitions", "HOUR"]

HOUR = 3600


def user_of(view: dict[str, Any]) -> str:
    return view["user"]


def hour_and_visitors(page: str, window: Window, visitors: int) -> dict[str, int]:
    return {"hour": int(window.start // HOUR), "visitors": visitors}


class PageVisitorsPerHour(StreamTask):
    def init(self, context: TaskContext) -> None:
        self.visitors = WindowedAggregation(context, Tumbling(HOUR), distinct_count(user_of), store="visitors",
                                            output="page-visitors", shape=hour_and_visitors)

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        self.visitors.add(envelope.value["page"], envelope.value, envelope.timestamp, collector)


def merge_partitions(rows: Iterable[tuple[str, dict[str, int]]]) -> dict[tuple[str, int], int]:
    """Global distinct users per (page, hour) from the partitions' ``page-visitors`` rows: a sum,
    because every user lives in exactly one partition."""
    merged: dict[tuple[str, int], int] = {}
    for page, value in rows:
        merged[(page, value["hour"])] = merged.get((page, value["hour"]), 0) + value["visitors"]
    return merged
