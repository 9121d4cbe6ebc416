"""A minimal counting task for the Spark runtime tests (imported by the Python workers)."""

from __future__ import annotations

import pyarrow as pa

from localstate.core.task import BatchTask, Collector, Coordinator, Envelope, StreamTask, TaskContext


class CountByKey(StreamTask):
    """Counts records per key in store ``counts`` and emits the running count to ``counts-out``."""

    def init(self, context: TaskContext) -> None:
        self.counts = context.store("counts")

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        count = (self.counts.get(envelope.key) or 0) + 1
        self.counts.put(envelope.key, count)
        collector.send("counts-out", envelope.key, count)


class CountByKeyBatch(BatchTask):
    """:class:`CountByKey` as a batch task: the same counts and the same outputs, one batch at a time."""

    def init(self, context: TaskContext) -> None:
        self.counts = context.store("counts")

    def process_batch(self, batch: pa.RecordBatch, collector: Collector, coordinator: Coordinator) -> None:
        keys = batch.column("key").to_pylist()
        collector.send_batch("counts-out", keys, self.counts.merge_many(keys, [1] * len(keys), results=True))
