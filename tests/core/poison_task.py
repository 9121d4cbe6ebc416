"""A task for the poison-pill tests: stores each value under its key (json serde, which refuses
NaN, Infinity and lone surrogates) and forwards it to a file-log output (json serde too)."""

from __future__ import annotations

from localstate.core.task import Collector, Coordinator, Envelope, StreamTask, TaskContext


class KeepLast(StreamTask):
    def init(self, context: TaskContext) -> None:
        self.last = context.store("last")

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        self.last.put(envelope.key, envelope.value)
        collector.send("out", envelope.key, envelope.value)
