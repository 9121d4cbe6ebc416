"""Windowed aggregation: count page views per user per event-time hour; emit each hour's counts
once the partition's event time has moved past the hour (and forget them)."""

from __future__ import annotations

from localstate.core.task import Collector, Coordinator, Envelope, StreamTask, TaskContext

HOUR = 3600


class HourlyPageViews(StreamTask):
    def init(self, context: TaskContext) -> None:
        self.counts = context.store("counts")   # "<hour>|<user>" -> views
        self.clock = context.store("clock")     # "hour" -> the open (latest) hour of this partition

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        hour = int(envelope.timestamp // HOUR)
        open_hour = self.clock.get("hour")
        if open_hour is not None and hour < open_hour:
            return  # late: its hour was already emitted
        if open_hour is None or hour > open_hour:
            self.close_hours(open_hour, hour, collector)
            self.clock.put("hour", hour)
        key = f"{hour:012d}|{envelope.key}"
        self.counts.put(key, (self.counts.get(key) or 0) + 1)

    def close_hours(self, open_hour: int | None, hour: int, collector: Collector) -> None:
        """Emit and forget every count of the hours in [open_hour, hour)."""
        # Hours before open_hour were already emitted and deleted: starting the scan there
        # saves a RocksDB iterator from stepping over their tombstones.
        start = None if open_hour is None else f"{open_hour:012d}"
        with self.counts.range(start, f"{hour:012d}") as closed:
            done = []
            for key, count in closed:
                window, user = key.split("|", 1)
                collector.send("hourly-counts", user, {"hour": int(window), "count": count})
                done.append(key)
        self.counts.delete_all(done)
