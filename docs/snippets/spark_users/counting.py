"""The task of docs/spark-users.md's snippets: a running count per user (``counts``), the users with
the most rows (``top``), and the new count sent for every row."""

from localstate import Collector, Coordinator, Envelope, StreamTask, TaskContext


class CountAndRank(StreamTask):
    def init(self, context: TaskContext) -> None:
        self.counts, self.top = context.store("counts"), context.store("top")

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        count = (self.counts.get(envelope.key) or 0) + 1
        self.counts.put(envelope.key, count)
        self.top.push(envelope.key, count)
        collector.send("counts", envelope.key, count)
