"""Windowed aggregation: count page views per user per event-time hour, and emit each hour's count
once, when the partition's watermark passes the end of the hour (then forget it). Two tasks do the
same: ``HourlyPageViews`` per record, ``HourlyPageViewsBatch`` on Arrow batches.

The window library (``localstate.windows``) keeps one count per (hour, user) in the ``counts`` store
and registers an event-time timer for the end of each hour (in its own timer namespace, so the
tasks define no ``on_timer``); the timer's firing sends the hour's counts and deletes them, in the
same commit."""

from __future__ import annotations

from typing import Any

from localstate.core.task import BatchTask, Collector, Coordinator, Envelope, StreamTask, TaskContext
from localstate.windows import Tumbling, Window, WindowedAggregation, count

HOUR = 3600


def hour_and_count(user: str, window: Window, views: int) -> dict[str, int]:
    return {"hour": int(window.start // HOUR), "count": views}


class HourlyPageViews(StreamTask):
    def init(self, context: TaskContext) -> None:
        self.hourly = WindowedAggregation(context, Tumbling(HOUR), count(), store="counts",
                                          output="hourly-counts", shape=hour_and_count)

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        self.hourly.add(envelope.key, envelope.value, envelope.timestamp, collector)


class HourlyPageViewsBatch(BatchTask):
    """:class:`HourlyPageViews` on Arrow batches (``task = "windowed_counts:HourlyPageViewsBatch"``):
    the same windows, counts and outputs; each batch's windows are computed in numpy and counted with
    one ``merge_many``."""

    def init(self, context: TaskContext) -> None:
        self.hourly = WindowedAggregation(context, Tumbling(HOUR), count(), store="counts",
                                          output="hourly-counts", shape=hour_and_count)

    def process_batch(self, batch: Any, collector: Collector, coordinator: Coordinator) -> None:
        self.hourly.add_batch(batch.column("key"), batch.column("value"), batch.column("timestamp"), collector)
