"""A task for the poison-pill tests: stores each value under its key (json serde, which refuses
NaN, Infinity and lone surrogates) and forwards it to a file-log output (json serde too)."""

from __future__ import annotations

import json
from typing import Any

from localstate.core.task import BatchTask, Collector, Coordinator, Envelope, StreamTask, TaskContext


class KeepLast(StreamTask):
    def init(self, context: TaskContext) -> None:
        self.last = context.store("last")

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        self.last.put(envelope.key, envelope.value)
        collector.send("out", envelope.key, envelope.value)


class KeepLastBatch(BatchTask):
    """KeepLast as a batch task: one ``put_many`` and one ``send_batch`` per batch."""

    def init(self, context: TaskContext) -> None:
        self.last = context.store("last")

    def process_batch(self, batch: Any, collector: Collector, coordinator: Coordinator) -> None:
        keys, values = batch.column("key").to_pylist(), batch.column("value").to_pylist()
        if batch.schema.field("value").metadata:  # a column pyarrow cannot hold exactly: JSON text
            values = [None if v is None else json.loads(v) for v in values]
        if batch.schema.field("key").metadata:
            keys = [json.loads(k) for k in keys]
        self.last.put_many(keys, values)
        collector.send_batch("out", keys, values)
