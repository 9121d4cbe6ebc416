"""The example's task: a running count per user, kept in the kv store ``counts``, written twice: per
record (``CountPerUser``, the default in job.toml) and as a batch task (``CountPerUserBatch``: set
``task = "counting:CountPerUserBatch"``). Both give the same state and outputs."""

import pyarrow as pa

from localstate import BatchTask, Collector, Coordinator, Envelope, StreamTask, TaskContext


class CountPerUser(StreamTask):
    """Counts rows per user; sends ``[count, rate value]`` to the ``counts`` output for every row."""

    def init(self, context: TaskContext) -> None:
        self.counts = context.store("counts")

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        count = (self.counts.get(envelope.key) or 0) + 1
        self.counts.put(envelope.key, count)
        collector.send("counts", envelope.key, [count, envelope.value["value"]])


class CountPerUserBatch(BatchTask):
    """:class:`CountPerUser` a micro-batch at a time: the rows arrive as Arrow columns (``value`` is a
    struct of the DataFrame's columns), the counts are one ``merge_many`` (each row's running count
    back, in order), the outputs one ``send_batch``."""

    def init(self, context: TaskContext) -> None:
        self.counts = context.store("counts")

    def process_batch(self, batch: pa.RecordBatch, collector: Collector, coordinator: Coordinator) -> None:
        users = batch.column("key").to_pylist()
        counts = self.counts.merge_many(users, [1] * len(users), results=True)
        values = batch.column("value").field("value").to_pylist()
        collector.send_batch("counts", users, [[count, value] for count, value in zip(counts, values)])
