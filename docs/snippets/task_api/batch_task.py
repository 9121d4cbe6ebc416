import pyarrow as pa

from localstate import BatchTask, Collector, Coordinator, TaskContext


class CountPerUserBatch(BatchTask):
    def init(self, context: TaskContext) -> None:
        self.counts = context.store("counts")

    def process_batch(self, batch: pa.RecordBatch, collector: Collector, coordinator: Coordinator) -> None:
        users = batch.column("key").to_pylist()
        counts = self.counts.merge_many(users, [1] * len(users), results=True)   # running counts, in order
        collector.send_batch("counts", users, counts)
