"""Tasks of the Spark timer tests (imported by the Python workers): a tumbling-window count on
event-time timers, and a task that reports each key once, a few seconds of processing time after it
was seen."""

from __future__ import annotations

from localstate.core.task import Collector, Coordinator, Envelope, StreamTask

WINDOW = 10.0


def window_end(ts: float) -> float:
    return (ts // WINDOW + 1) * WINDOW


class WindowCount(StreamTask):
    """Records per key and 10s event-time window, emitted once when the watermark passes the
    window's end: ``(key, [end, count])``. State is keyed by window, as a batch may hold records of
    the next window before the previous one's timer fires at the batch's end."""

    def init(self, context):
        self.counts = context.kv("counts")
        self.timers = context.timers

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        end = window_end(envelope.timestamp)
        slot = f"{envelope.key}@{end}"
        self.counts.put(slot, (self.counts.get(slot) or 0) + 1)
        self.timers.register_event_time(envelope.key, end)

    def on_timer(self, key, timestamp, collector: Collector, coordinator: Coordinator) -> None:
        slot = f"{key}@{timestamp}"
        collector.send("windows", key, [timestamp, self.counts.get(slot)])
        self.counts.delete(slot)


class ReportLater(StreamTask):
    """Each key is reported ``(key, "idle")`` two seconds (processing time) after it was last seen:
    its pending timer (in ``counts``, as milliseconds) moves on each record."""

    def init(self, context):
        self.timers = context.timers
        self.pending = context.kv("counts")

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        previous = self.pending.get(envelope.key)
        if previous is not None:
            self.timers.delete_processing_time(envelope.key, previous / 1000)
        due = int((self.timers.processing_time() + 2.0) * 1000)
        self.timers.register_processing_time(envelope.key, due / 1000)
        self.pending.put(envelope.key, due)

    def on_timer(self, key, timestamp, collector: Collector, coordinator: Coordinator) -> None:
        collector.send("windows", key, "idle")
        self.pending.delete(key)
