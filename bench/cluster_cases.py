"""The task of ``python -m bench cluster`` (imported by the executors' Python workers)."""

from __future__ import annotations

from localstate.core.task import Collector, Coordinator, Envelope, StreamTask, TaskContext

__all__ = ["CountByKey"]


class CountByKey(StreamTask):
    """Counts records per key in store ``counts`` and emits the running count to ``counts-out``."""

    def init(self, context: TaskContext) -> None:
        self.counts = context.store("counts")

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        count = (self.counts.get(envelope.key) or 0) + 1
        self.counts.put(envelope.key, count)
        collector.send("counts-out", envelope.key, count)
