"""Bounded sort: merge log lines collected from many machines into one totally ordered log per
partition.

Lines arrive in collection order, up to a few seconds late relative to one another (shipping
delays differ per machine). Each line goes into a reorder buffer (``engine = "heap"``,
``kind = "reorder"``) under its own timestamp ``at``; ``drain()`` releases every buffered line at or
below the watermark (newest ``at`` seen minus ``max_lateness``) in timestamp order. A line older than
the watermark can no longer be placed in order: ``late_policy = "side_output"`` hands it to
``take_late()`` and it is written to the ``late-lines`` output instead.

A control line ``{"watermark": T}`` (the collector has shipped everything up to ``T``) releases every
buffered line with ``at <= T`` at once; ``make_input.py`` ends each partition's input with one.
"""

from __future__ import annotations

from localstate.core.task import Collector, Coordinator, Envelope, StreamTask, TaskContext

__all__ = ["MergeLogs"]


class MergeLogs(StreamTask):
    def init(self, context: TaskContext) -> None:
        self.buffer = context.store("buffer")   # reorder buffer: line dicts by their "at"

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        line = envelope.value
        if "watermark" in line:
            released = self.buffer.drain_until(line["watermark"])
        else:
            self.buffer.push(line, line["at"])
            released = self.buffer.drain()
            for late in self.buffer.take_late():
                collector.send("late-lines", late.event["service"], late.event)
        for event in released:
            collector.send("merged", event.event["service"], event.event)
